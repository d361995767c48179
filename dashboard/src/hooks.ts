// Data loading with live refresh.
import { useCallback, useEffect, useRef, useState } from "preact/hooks";
import { ApiError } from "./api";
import { loadSettings, refreshInterval } from "./settings";

export interface Loaded<T> {
  data: T | undefined;
  error: ApiError | null;
  loading: boolean;
  reload: () => void;
  updatedAt: number | null;
}

const RETRY_EVENT = "agentbolt:retry";

/** Makes every mounted `useData` load again now (the connection banner's retry); the data on screen stays. */
export function retryAll(): void {
  window.dispatchEvent(new Event(RETRY_EVENT));
}

/** Calls `load` when `key` changes and, with `live`, again every refresh interval while the page is visible. */
export function useData<T>(load: () => Promise<T>, key: string, live = true): Loaded<T> {
  const [state, setState] = useState<{ data?: T; error: ApiError | null; loading: boolean; updatedAt: number | null; key: string }>({
    error: null,
    loading: true,
    updatedAt: null,
    key,
  });
  const generation = useRef(0);
  const loadRef = useRef(load);
  loadRef.current = load;

  const run = useCallback(() => {
    const mine = ++generation.current;
    setState((s) => ({ ...s, loading: true }));
    loadRef.current().then(
      (data) => mine === generation.current && setState({ data, error: null, loading: false, updatedAt: Date.now(), key }),
      (error: unknown) =>
        mine === generation.current &&
        setState((s) => ({
          ...s,
          error: error instanceof ApiError ? error : new ApiError(String(error), -1),
          loading: false,
          key,
        })),
    );
  }, [key]);

  useEffect(() => {
    window.addEventListener(RETRY_EVENT, run);
    return () => window.removeEventListener(RETRY_EVENT, run);
  }, [run]);

  useEffect(() => {
    run();
    const seconds = refreshInterval(loadSettings().refreshSeconds) ?? 0;
    if (!live || seconds <= 0) return;
    const timer = window.setInterval(() => {
      if (document.visibilityState === "visible") run();
    }, seconds * 1000);
    return () => window.clearInterval(timer);
  }, [run, live]);

  const stale = state.key !== key;
  return {
    data: stale ? undefined : state.data,
    error: stale ? null : state.error,
    loading: stale || state.loading,
    reload: run,
    updatedAt: state.updatedAt,
  };
}
