// User settings, kept in the browser (localStorage); the API key stays in sessionStorage unless remembered.
export type Theme = "system" | "light" | "dark";

export interface Settings {
  endpoint: string; // "" = the server that serves the dashboard
  refreshSeconds: number; // 0 = no live updates
  theme: Theme;
}

/** Live updates come at most this often: each one asks the store for the page's data again. */
export const MIN_REFRESH_SECONDS = 1;
export const MAX_REFRESH_SECONDS = 3600;

/**
 * A refresh interval the page can use: 0 (no live updates), or `MIN_REFRESH_SECONDS` to `MAX_REFRESH_SECONDS` (a
 * value between 0 and the least is raised to it, a larger one lowered to the most); null for one that is not a
 * number of seconds at all (NaN, negative, infinite).
 */
export function refreshInterval(seconds: unknown): number | null {
  if (typeof seconds !== "number" || !Number.isFinite(seconds) || seconds < 0) return null;
  if (seconds === 0) return 0;
  return Math.min(MAX_REFRESH_SECONDS, Math.max(MIN_REFRESH_SECONDS, seconds));
}

const KEY = "agentbolt.dashboard.settings";
const TOKEN_KEY = "agentbolt.dashboard.token";
const DEFAULTS: Settings = { endpoint: "", refreshSeconds: 3, theme: "system" };

export function loadSettings(): Settings {
  try {
    const raw = localStorage.getItem(KEY);
    if (!raw) return { ...DEFAULTS };
    const parsed = JSON.parse(raw) as Partial<Settings>;
    return {
      endpoint: typeof parsed.endpoint === "string" ? parsed.endpoint : DEFAULTS.endpoint,
      refreshSeconds: refreshInterval(parsed.refreshSeconds) ?? DEFAULTS.refreshSeconds,
      theme: parsed.theme === "light" || parsed.theme === "dark" ? parsed.theme : "system",
    };
  } catch {
    return { ...DEFAULTS };
  }
}

export function saveSettings(settings: Settings): void {
  localStorage.setItem(KEY, JSON.stringify(settings));
}

export function loadToken(): string {
  return sessionStorage.getItem(TOKEN_KEY) || localStorage.getItem(TOKEN_KEY) || "";
}

export function saveToken(token: string, remember: boolean): void {
  sessionStorage.removeItem(TOKEN_KEY);
  localStorage.removeItem(TOKEN_KEY);
  if (token) (remember ? localStorage : sessionStorage).setItem(TOKEN_KEY, token);
}

export function applyTheme(theme: Theme): void {
  const dark = theme === "dark" || (theme === "system" && window.matchMedia?.("(prefers-color-scheme: dark)").matches);
  document.documentElement.dataset.theme = dark ? "dark" : "light";
}
