// Reading spans: attribute trees, the span tree, LLM calls, rewards and links (the store keeps attributes flat:
// "gen_ai.prompt.0.role" = "user").
import type { Span } from "./api";
import { fromWire } from "./format";

export type Tree = { [key: string]: Tree | unknown };

function listify(node: unknown): unknown {
  if (node === null || typeof node !== "object" || Array.isArray(node)) return node;
  const entries = Object.entries(node as Record<string, unknown>).map(([k, v]) => [k, listify(v)] as const);
  const keys = entries.map(([k]) => k);
  const isList = keys.length > 0 && keys.every((k, i) => k === String(i)) && keys.length === new Set(keys).size;
  if (isList) return entries.map(([, v]) => v);
  return Object.fromEntries(entries);
}

/**
 * The attributes under `prefix` as a nested value ("a.0.b" keys become [{b: ...}]); undefined when none.
 *
 * The nodes have no prototype: an agent writes the keys, and one such as "gen_ai.prompt.__proto__.x" must make a
 * node named "__proto__", not write into Object.prototype (which would change every object of the page).
 */
export function unflatten(attributes: Record<string, unknown>, prefix: string): unknown {
  const root: Record<string, unknown> = Object.create(null);
  let found = false;
  for (const [key, value] of Object.entries(attributes)) {
    if (key !== prefix && !key.startsWith(prefix + ".")) continue;
    found = true;
    if (key === prefix) return value;
    const parts = key.slice(prefix.length + 1).split(".");
    let node = root;
    parts.forEach((part, i) => {
      if (i === parts.length - 1) node[part] = value;
      else {
        if (node[part] === null || typeof node[part] !== "object") node[part] = Object.create(null);
        node = node[part] as Record<string, unknown>;
      }
    });
  }
  return found ? listify(root) : undefined;
}

export interface TreeRow {
  span: Span;
  depth: number;
  childCount: number;
}

/** Spans in tree order (parents before children, siblings by start time), each with its depth. */
export function spanTree(spans: Span[]): TreeRow[] {
  const ids = new Set(spans.map((s) => s.span_id));
  const children = new Map<string | null, Span[]>();
  for (const span of spans) {
    const parent = span.parent_id && ids.has(span.parent_id) && span.parent_id !== span.span_id ? span.parent_id : null;
    if (!children.has(parent)) children.set(parent, []);
    children.get(parent)!.push(span);
  }
  const order = (a: Span, b: Span) => (a.start_time ?? 0) - (b.start_time ?? 0) || a.sequence_id - b.sequence_id;
  const rows: TreeRow[] = [];
  const seen = new Set<string>();
  // Depth first with a stack of its own, not recursion: a chain of spans each the child of the one before may be
  // deeper than the JavaScript call stack.
  const stack: Array<{ span: Span; depth: number }> = [];
  const visit = (roots: Span[]) => {
    for (let i = roots.length - 1; i >= 0; i--) stack.push({ span: roots[i], depth: 0 });
    while (stack.length) {
      const { span, depth } = stack.pop()!;
      if (seen.has(span.span_id)) continue;
      seen.add(span.span_id);
      const kids = (children.get(span.span_id) ?? []).sort(order);
      rows.push({ span, depth, childCount: kids.length });
      for (let i = kids.length - 1; i >= 0; i--) stack.push({ span: kids[i], depth: depth + 1 });
    }
  };
  visit((children.get(null) ?? []).sort(order));
  // Spans whose parents form a cycle (a's parent b, b's parent a) hang from no root: they are listed as roots.
  for (const span of [...spans].sort(order)) if (!seen.has(span.span_id)) visit([span]);
  return rows;
}

export interface ChatMessage {
  role: string;
  content: unknown;
  name?: string;
  tool_calls?: unknown;
  tool_call_id?: string;
}

export interface LlmCall {
  model: string | null;
  messages: ChatMessage[];
  completions: ChatMessage[];
  tools: unknown;
  inputTokens: number | null;
  outputTokens: number | null;
  promptTokenIds: number[] | null;
  responseTokenIds: number[] | null;
  logprobs: number[] | null;
  finishReasons: string[] | null;
  stream: boolean | null;
}

function asMessages(value: unknown): ChatMessage[] {
  if (!Array.isArray(value)) return [];
  return value.map((m) => (m && typeof m === "object" ? (m as ChatMessage) : { role: "?", content: m }));
}

function numbers(value: unknown): number[] | null {
  if (Array.isArray(value) && value.every((v) => typeof v === "number")) return value as number[];
  if (typeof value === "string" && value.startsWith("[")) {
    try {
      const parsed = JSON.parse(value);
      if (Array.isArray(parsed) && parsed.every((v) => typeof v === "number")) return parsed;
    } catch {
      return null;
    }
  }
  return null;
}

function num(value: unknown): number | null {
  return typeof value === "number" && Number.isFinite(value) ? value : null;
}

/** The LLM call a span records (OpenAI SDK instrumentation or the gateway), or null for other spans. */
export function llmCall(span: Span): LlmCall | null {
  const a = span.attributes ?? {};
  const keys = Object.keys(a);
  const isCall =
    keys.some((k) => k.startsWith("gen_ai.prompt.") || k.startsWith("gen_ai.completion.")) ||
    "prompt_token_ids" in a ||
    "response_token_ids" in a;
  if (!isCall) return null;
  const finish = a["gen_ai.response.finish_reasons"];
  return {
    model: (a["gen_ai.response.model"] as string) ?? (a["gen_ai.request.model"] as string) ?? null,
    messages: asMessages(unflatten(a, "gen_ai.prompt")),
    completions: asMessages(unflatten(a, "gen_ai.completion")),
    tools: unflatten(a, "gen_ai.request.functions") ?? null,
    inputTokens: num(a["gen_ai.usage.input_tokens"]) ?? num(a["gen_ai.usage.prompt_tokens"]),
    outputTokens: num(a["gen_ai.usage.output_tokens"]) ?? num(a["gen_ai.usage.completion_tokens"]),
    promptTokenIds: numbers(a["prompt_token_ids"]),
    responseTokenIds: numbers(a["response_token_ids"]),
    logprobs: numbers(a["response_logprobs"]),
    finishReasons: Array.isArray(finish) ? (finish as string[]) : null,
    stream: typeof a["gen_ai.request.stream"] === "boolean" ? (a["gen_ai.request.stream"] as boolean) : null,
  };
}

/** The name of the spans `emit_reward` records (annotation spans), where the store reads a rollout's reward. */
export const REWARD_SPAN_NAME = "agentlightning.annotation";

export interface Reward {
  name: string;
  value: number;
}

/** Reward dimensions a span carries (primary first). */
export function rewards(span: Span): Reward[] {
  const a = span.attributes ?? {};
  const list = unflatten(a, "agentlightning.reward");
  if (Array.isArray(list)) {
    // A value is a number, or NaN or an infinity as the store's JSON writes them ("NaN", "Infinity"): kept as emitted.
    return list
      .filter((r) => r && typeof r === "object" && fromWire((r as Record<string, unknown>).value) !== null)
      .map((r) => ({ name: String((r as Record<string, unknown>).name ?? "reward"), value: fromWire((r as Record<string, unknown>).value)! }));
  }
  const legacy = fromWire(a["reward"]);
  if (span.name === REWARD_SPAN_NAME && legacy !== null) return [{ name: "reward", value: legacy }];
  return [];
}

/** The reward of the last span that carries one. */
export function finalReward(spans: Span[]): number | null {
  for (let i = spans.length - 1; i >= 0; i--) {
    const found = rewards(spans[i]);
    if (found.length) return found[0].value;
  }
  return null;
}

export interface LinkCondition {
  key_match: string;
  value_match: string;
}

export function linkConditions(span: Span): LinkCondition[] {
  const list = unflatten(span.attributes ?? {}, "agentlightning.link");
  return Array.isArray(list) ? (list.filter((l) => l && typeof l === "object") as LinkCondition[]) : [];
}

/** The spans a span links to: those matching all of its link conditions. */
export function linkedSpans(span: Span, spans: Span[]): Span[] {
  const conditions = linkConditions(span);
  if (!conditions.length) return [];
  return spans.filter(
    (other) =>
      other.span_id !== span.span_id &&
      conditions.every((c) =>
        c.key_match === "span_id"
          ? other.span_id === c.value_match
          : c.key_match === "trace_id"
            ? other.trace_id === c.value_match
            : String(other.attributes?.[c.key_match]) === c.value_match,
      ),
  );
}

export function tags(span: Span): string[] {
  const list = unflatten(span.attributes ?? {}, "agentlightning.tag");
  return Array.isArray(list) ? list.map(String) : [];
}

export type SpanKind = "llm" | "reward" | "annotation" | "message" | "exception" | "operation" | "other";

export function spanKind(span: Span): SpanKind {
  if (llmCall(span)) return "llm";
  if (rewards(span).length) return "reward";
  if (span.name === "agentlightning.annotation") return "annotation";
  if (span.name === "agentlightning.message") return "message";
  if (span.name === "agentlightning.exception" || span.status?.status_code === "ERROR") return "exception";
  if (span.name === "agentlightning.operation") return "operation";
  return "other";
}
