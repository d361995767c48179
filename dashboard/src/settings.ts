// User settings, kept in the browser (localStorage); the API key stays in sessionStorage unless remembered.
export type Theme = "system" | "light" | "dark";

export interface Settings {
  endpoint: string; // "" = the server that serves the dashboard
  refreshSeconds: number; // 0 = no live updates
  theme: Theme;
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
      refreshSeconds:
        typeof parsed.refreshSeconds === "number" && parsed.refreshSeconds >= 0 ? parsed.refreshSeconds : DEFAULTS.refreshSeconds,
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
