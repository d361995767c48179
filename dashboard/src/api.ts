// The store's HTTP API as the dashboard uses it. Every request goes to `<endpoint>/v1/agl/...`; the bearer token,
// when one is needed, travels in the Authorization header (never in a URL).
import { noteServerDate, noteServerNow } from "./clock";
import type { WireNumber } from "./format";
import { loadSettings, loadToken } from "./settings";

export class ApiError extends Error {
  constructor(
    message: string,
    readonly status: number, // 0 = the store could not be reached
    readonly detail: unknown = null, // the answer's "detail" (a list of ValidationIssue for a 422)
  ) {
    super(message);
  }
  get unauthorized(): boolean {
    return this.status === 401;
  }
  get unreachable(): boolean {
    return this.status === 0;
  }
}

type Listener = (error: ApiError | null) => void;
const listeners = new Set<Listener>();

/** Be told of the connection state: an error when a request failed to reach the store or was refused, null when a request succeeded. */
export function onConnection(listener: Listener): () => void {
  listeners.add(listener);
  return () => listeners.delete(listener);
}

function notify(error: ApiError | null): void {
  for (const listener of listeners) listener(error);
}

/** Root URL of the store's API (ends with "/"). */
export function apiRoot(): string {
  const endpoint = loadSettings().endpoint.trim();
  if (endpoint) return endpoint.endsWith("/") ? endpoint : endpoint + "/";
  return new URL(".", document.baseURI).toString();
}

/** One problem of a refused request, as the store's validation reports it (422). */
export interface ValidationIssue {
  loc: Array<string | number>; // ["query", "sort_by"], ["query", "status", 0], ["body", ...]
  msg: string;
  input?: unknown;
}

/** The issues of a 422 answer (none for other errors). */
export function validationIssues(error: ApiError): ValidationIssue[] {
  if (error.status !== 422 || !Array.isArray(error.detail)) return [];
  return error.detail.filter((d): d is ValidationIssue => !!d && typeof d === "object" && Array.isArray(d.loc) && typeof d.msg === "string");
}

function detailOf(body: unknown): unknown {
  return body && typeof body === "object" && "detail" in body ? (body as { detail: unknown }).detail : null;
}

function messageOf(detail: unknown): string | null {
  if (detail === null || detail === undefined) return null;
  if (typeof detail === "string") return detail;
  if (Array.isArray(detail) && detail.length && detail.every((d) => d && typeof d === "object" && Array.isArray(d.loc))) {
    // Validation issues: "sort_by: Input should be 'start_time', ... or 'reward'"
    return (detail as ValidationIssue[]).map((d) => `${d.loc.slice(1).join(".") || d.loc.join(".")}: ${d.msg}`).join("; ");
  }
  return JSON.stringify(detail);
}

export type Query = Record<string, string | number | boolean | null | undefined | Array<string | number>>;

export async function request<T>(method: "GET" | "POST", path: string, options: { query?: Query; body?: unknown } = {}): Promise<T> {
  const url = new URL("v1/agl/" + path.replace(/^\//, ""), apiRoot());
  for (const [key, value] of Object.entries(options.query ?? {})) {
    if (value === null || value === undefined || value === "") continue;
    if (Array.isArray(value)) value.forEach((v) => url.searchParams.append(key, String(v)));
    else url.searchParams.set(key, String(value));
  }
  const headers: Record<string, string> = { Accept: "application/json" };
  const token = loadToken();
  if (token) headers.Authorization = `Bearer ${token}`;
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  let response: Response;
  try {
    response = await fetch(url.toString(), {
      method,
      headers,
      body: options.body === undefined ? undefined : JSON.stringify(options.body),
      cache: "no-store",
    });
  } catch (exc) {
    const error = new ApiError(`Cannot reach the store at ${apiRoot()}: ${(exc as Error).message}`, 0);
    notify(error);
    throw error;
  }
  noteServerDate(response.headers.get("date"));
  let body: unknown = null;
  const text = await response.text();
  if (text) {
    try {
      body = JSON.parse(text);
    } catch {
      body = text;
    }
  }
  if (response.ok && typeof body === "string") {
    // Not the store's JSON: a page a proxy or a login wall answers with, or an endpoint that is not a store.
    const type = response.headers.get("content-type") ?? "no content type";
    const error = new ApiError(`${url.pathname} answered with something that is not JSON (${type}): is ${apiRoot()} a store?`, response.status);
    notify(error);
    throw error;
  }
  if (!response.ok) {
    const detail = detailOf(body);
    const message = messageOf(detail) ?? `${response.status} ${response.statusText}`;
    const error = new ApiError(message, response.status, detail);
    if (response.status === 401 || response.status >= 500 || response.status === 409) notify(error);
    throw error;
  }
  notify(null);
  return body as T;
}

// ---- types of the store's answers --------------------------------------------------------------------------------

export interface Attempt {
  rollout_id: string;
  attempt_id: string;
  sequence_id: number;
  start_time: number;
  end_time: number | null;
  status: string;
  worker_id: string | null;
  last_heartbeat_time: number | null;
  metadata: Record<string, unknown> | null;
}

export interface Rollout {
  rollout_id: string;
  input: unknown;
  start_time: number;
  end_time: number | null;
  mode: string | null;
  resources_id: string | null;
  status: string;
  config: { timeout_seconds: number | null; unresponsive_seconds: number | null; max_attempts: number; retry_condition: string[] };
  metadata: Record<string, unknown> | null;
  attempt?: Attempt;
}

export interface RolloutSummary {
  rollout_id: string;
  status: string;
  mode: string | null;
  resources_id: string | null;
  start_time: number;
  end_time: number | null;
  duration: number | null;
  input_preview: string;
  reward: WireNumber | null; // NaN and infinities arrive as "NaN", "Infinity", "-Infinity"
  attempt: Attempt | null;
}

export interface Page<T> {
  items: T[];
  total: number;
  limit: number;
  offset: number;
}

export interface RolloutPage extends Page<RolloutSummary> {
  counts: Record<string, number>;
}

export interface Span {
  rollout_id: string;
  attempt_id: string;
  sequence_id: number;
  trace_id: string;
  span_id: string;
  parent_id: string | null;
  name: string;
  status: { status_code: string; description: string | null };
  attributes: Record<string, unknown>;
  events: Array<{ name: string; attributes: Record<string, unknown>; timestamp: number | null }>;
  links: Array<{ context: { trace_id: string; span_id: string }; attributes: Record<string, unknown> | null }>;
  start_time: number | null;
  end_time: number | null;
}

export interface ResourcesUpdate {
  resources_id: string;
  create_time: number;
  update_time: number;
  version: number;
  resources: Record<string, Record<string, unknown> & { resource_type: string }>;
}

export interface Worker {
  worker_id: string;
  status: string;
  heartbeat_stats: Record<string, unknown> | null;
  last_heartbeat_time: number | null;
  last_dequeue_time: number | null;
  last_busy_time: number | null;
  last_idle_time: number | null;
  current_rollout_id: string | null;
  current_attempt_id: string | null;
  finished_recently: number;
  throughput_per_minute: number;
}

export interface MetricsRecord {
  run_id: string;
  step: number;
  time: number;
  values: Record<string, number | null>;
}

export const api = {
  rollouts: (query: Query) => request<RolloutPage>("GET", "dashboard/rollouts", { query }),
  rollout: (id: string) => request<Rollout | null>("GET", `rollouts/${encodeURIComponent(id)}`),
  attempts: (id: string) => request<Page<Attempt>>("GET", `rollouts/${encodeURIComponent(id)}/attempts`),
  /** The spans of an attempt by sequence id: the first `limit` (all when none), only those named `name`, or one. */
  spans: (rolloutId: string, attemptId: string, options: { limit?: number; name?: string; spanId?: string } = {}) =>
    request<Page<Span>>("POST", "spans/search", {
      body: { rollout_id: rolloutId, attempt_id: attemptId, limit: options.limit, name: options.name, span_id: options.spanId },
    }),
  resources: () => request<Page<ResourcesUpdate>>("GET", "resources", { query: { sort_by: "update_time", sort_order: "desc" } }),
  resourcesById: (id: string) => request<ResourcesUpdate | null>("GET", `resources/${encodeURIComponent(id)}`),
  workers: () =>
    request<{ items: Worker[]; window_seconds: number; now: number }>("GET", "dashboard/workers").then((answer) => {
      noteServerNow(answer?.now);
      return answer;
    }),
  metrics: () => request<Page<MetricsRecord>>("GET", "metrics"),
  statistics: () => request<Record<string, unknown>>("GET", "statistics"),
  health: () => request<{ status: string }>("GET", "health"),
};
