// Settings: the store endpoint, the refresh interval, the theme, and the API key.
import { useState } from "preact/hooks";
import { api, apiRoot } from "../api";
import {
  applyTheme,
  loadSettings,
  loadToken,
  MAX_REFRESH_SECONDS,
  MIN_REFRESH_SECONDS,
  refreshInterval,
  saveSettings,
  saveToken,
  type Settings,
  type Theme,
} from "../settings";

export function SettingsPage() {
  const [settings, setSettings] = useState<Settings>(loadSettings);
  const [refreshText, setRefreshText] = useState(() => String(settings.refreshSeconds));
  const [saved, setSaved] = useState("");
  const [check, setCheck] = useState("");
  const hasToken = Boolean(loadToken());
  const save = (next: Settings, message = "Saved.") => {
    setSettings(next);
    saveSettings(next);
    applyTheme(next.theme);
    setSaved(message);
  };
  const limits = `0 (no live updates) or ${MIN_REFRESH_SECONDS} to ${MAX_REFRESH_SECONDS} seconds`;
  const submit = () => {
    const wanted = refreshText.trim() === "" ? NaN : Number(refreshText);
    const seconds = refreshInterval(wanted);
    if (seconds === null) {
      setSaved(`Not saved: the refresh interval is ${limits}, not "${refreshText}".`);
      return;
    }
    setRefreshText(String(seconds));
    const note = seconds === wanted ? "Saved." : `Saved, refreshing every ${seconds} s: the interval is ${limits}.`;
    save({ ...settings, refreshSeconds: seconds }, note);
  };
  return (
    <section aria-labelledby="settings-title" class="settings">
      <h1 id="settings-title">Settings</h1>
      <form
        noValidate
        onSubmit={(e) => {
          e.preventDefault();
          submit();
        }}
      >
        <label>
          Store endpoint
          <input
            type="url"
            value={settings.endpoint}
            placeholder="this server"
            onInput={(e) => setSettings({ ...settings, endpoint: (e.target as HTMLInputElement).value })}
          />
          <span class="hint">Empty: the server that serves this page ({new URL(".", document.baseURI).toString()}). Another store must allow this origin (--cors-origin).</span>
        </label>
        <label>
          Refresh every (seconds, 0 = no live updates)
          <input
            type="number"
            min="0"
            max={String(MAX_REFRESH_SECONDS)}
            step="any"
            value={refreshText}
            aria-describedby="refresh-limits"
            onInput={(e) => setRefreshText((e.target as HTMLInputElement).value)}
          />
          <span class="hint" id="refresh-limits">
            At least {MIN_REFRESH_SECONDS} s and at most {MAX_REFRESH_SECONDS} s between live updates; 0 turns them off.
          </span>
        </label>
        <label>
          Theme
          <select value={settings.theme} onChange={(e) => save({ ...settings, theme: (e.target as HTMLSelectElement).value as Theme })}>
            <option value="system">system</option>
            <option value="light">light</option>
            <option value="dark">dark</option>
          </select>
        </label>
        <div class="filter-actions">
          <button type="submit">Save</button>
          <button
            type="button"
            class="secondary"
            onClick={async () => {
              setCheck("Checking…");
              try {
                await api.statistics();
                setCheck(`Connected to ${apiRoot()}.`);
              } catch (exc) {
                setCheck(`Failed: ${(exc as Error).message}`);
              }
            }}
          >
            Test connection
          </button>
          <span role="status">{saved || check}</span>
        </div>
      </form>
      <h2>API key</h2>
      <p>
        {hasToken ? "An API key is set for this browser session." : "No API key is set."} The key is sent in the Authorization header and
        never appears in a URL.
      </p>
      {hasToken && (
        <button
          type="button"
          class="secondary"
          onClick={() => {
            saveToken("", false);
            setSaved("API key forgotten.");
          }}
        >
          Forget the API key
        </button>
      )}
    </section>
  );
}
