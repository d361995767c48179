// URLs of the app, relative to where it is served (the <base href> the server writes into index.html), so every
// view has an address that survives a reload, also behind a reverse proxy's path prefix.
import { useEffect, useState } from "preact/hooks";

export interface Location {
  path: string; // without the base, starting with "/"
  params: URLSearchParams;
}

function basePath(): string {
  return new URL(".", document.baseURI).pathname; // ends with "/"
}

export function currentLocation(): Location {
  const base = basePath();
  const pathname = window.location.pathname;
  const rest = pathname.startsWith(base) ? pathname.slice(base.length) : pathname.replace(/^\//, "");
  return { path: "/" + rest, params: new URLSearchParams(window.location.search) };
}

/** The href of an app path ("/rollouts/ro-1?x=1") for links. */
export function href(path: string): string {
  return basePath() + path.replace(/^\//, "");
}

const listeners = new Set<() => void>();
window.addEventListener("popstate", () => listeners.forEach((l) => l()));

export function navigate(path: string, options: { replace?: boolean } = {}): void {
  const target = href(path);
  if (target === window.location.pathname + window.location.search) return;
  if (options.replace) history.replaceState(null, "", target);
  else history.pushState(null, "", target);
  listeners.forEach((l) => l());
  if (!options.replace) window.scrollTo(0, 0);
}

export function useLocation(): Location {
  const [location, setLocation] = useState(currentLocation);
  useEffect(() => {
    const update = () =>
      setLocation((old) => {
        const next = currentLocation();
        return old.path === next.path && old.params.toString() === next.params.toString() ? old : next;
      });
    listeners.add(update);
    update(); // a child may have navigated before this effect ran (effects run children first)
    return () => {
      listeners.delete(update);
    };
  }, []);
  return location;
}

/** Builds "path?query" from the non-empty parameters. */
export function withQuery(path: string, params: Record<string, string | number | null | undefined>): string {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) if (value !== null && value !== undefined && value !== "") search.set(key, String(value));
  const text = search.toString();
  return text ? `${path}?${text}` : path;
}

/** Route matching: "/rollouts/:id" against "/rollouts/ro-1" gives {id: "ro-1"}. A parameter that is not valid
 * percent-encoding ("/rollouts/%E0%A4") matches nothing: the address then shows the not-found page. */
export function match(pattern: string, path: string): Record<string, string> | null {
  const p = pattern.split("/").filter(Boolean);
  const s = path.split("/").filter(Boolean);
  if (p.length !== s.length) return null;
  const result: Record<string, string> = {};
  for (let i = 0; i < p.length; i++) {
    if (p[i].startsWith(":")) {
      try {
        result[p[i].slice(1)] = decodeURIComponent(s[i]);
      } catch {
        return null;
      }
    } else if (p[i] !== s[i]) return null;
  }
  return result;
}
