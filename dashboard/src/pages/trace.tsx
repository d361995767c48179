// The trace of one attempt: the span tree on a time axis, and the selected span's details (LLM call messages, tool
// calls, response, token counts, token ids and logprobs; rewards; annotations; links; attributes).
import { useEffect, useMemo, useState } from "preact/hooks";
import { api, type Attempt, type Rollout, type Span } from "../api";
import { ErrorNote, KeyValues, Loading, TextBlock, Truncated } from "../components/common";
import { formatDuration, formatNumber, toText } from "../format";
import { useData } from "../hooks";
import { navigate, withQuery, type Location } from "../router";
import { linkedSpans, llmCall, rewards, spanKind, spanTree, tags, type ChatMessage, type LlmCall } from "../spans";

/** Spans read at a time: an attempt may hold tens of thousands, and the tree shows the first ones by sequence id. */
const SPAN_PAGE = 1000;
/** Deepest indent drawn in the tree: deeper spans line up at it (their level is still announced). */
const MAX_INDENT_LEVELS = 24;

export function TraceView(props: { rollout: Rollout; attempt: Attempt; location: Location; live: boolean }) {
  const { rollout, attempt } = props;
  const [limit, setLimit] = useState(SPAN_PAGE);
  const spans = useData(() => api.spans(rollout.rollout_id, attempt.attempt_id, { limit }), `spans:${attempt.attempt_id}`, props.live);
  // More spans are read into the same data, so the tree stays on screen while they load.
  useEffect(() => {
    if (limit > SPAN_PAGE) spans.reload();
  }, [limit]);
  const selectedId = props.location.params.get("span");
  const select = (spanId: string | null) =>
    navigate(withQuery(props.location.path, { span: spanId }), { replace: true });
  const items = spans.data?.items ?? [];
  const total = spans.data?.total ?? items.length;
  const selected = items.find((s) => s.span_id === selectedId) ?? null;
  return (
    <section aria-labelledby="trace-title" class="card trace">
      <h2 id="trace-title">
        Trace of attempt {attempt.sequence_id} <span class="muted mono">{attempt.attempt_id}</span>
      </h2>
      <ErrorNote error={spans.error} what="the spans" />
      {!spans.data && !spans.error && <Loading what="spans" />}
      {spans.data && !items.length && <p class="muted">This attempt has no span yet.</p>}
      {items.length > 0 && (
        <div class="trace-layout">
          <div>
            <SpanTree spans={items} selected={selected?.span_id ?? null} onSelect={select} />
            {total > items.length && (
              <p class="muted more-spans">
                The first {items.length.toLocaleString()} of {total.toLocaleString()} spans, by sequence id.{" "}
                <button type="button" class="link-button" disabled={spans.loading} onClick={() => setLimit(items.length + SPAN_PAGE)}>
                  show {Math.min(SPAN_PAGE, total - items.length).toLocaleString()} more
                </button>
              </p>
            )}
          </div>
          <div class="span-details" aria-live="polite">
            {selected ? (
              <SpanDetails span={selected} spans={items} onSelect={select} />
            ) : selectedId && spans.data ? (
              <UnlistedSpan rollout={rollout} attempt={attempt} spanId={selectedId} spans={items} onSelect={select} />
            ) : (
              <p class="muted">Select a span to see its details.</p>
            )}
          </div>
        </div>
      )}
    </section>
  );
}

/** The selected span when it is not among the spans read for the tree (a link to a late span of a long trace). */
function UnlistedSpan(props: { rollout: Rollout; attempt: Attempt; spanId: string; spans: Span[]; onSelect: (id: string) => void }) {
  const { rollout, attempt, spanId } = props;
  const one = useData(
    () => api.spans(rollout.rollout_id, attempt.attempt_id, { spanId, limit: 1 }),
    `span:${attempt.attempt_id}:${spanId}`,
    false,
  );
  if (!one.data) return one.error ? <ErrorNote error={one.error} what={`span ${spanId}`} /> : <Loading what={`span ${spanId}`} />;
  const span = one.data.items[0];
  if (!span)
    return (
      <p class="error-note">
        This attempt has no span <span class="mono">{spanId}</span>.
      </p>
    );
  return <SpanDetails span={span} spans={props.spans} onSelect={props.onSelect} />;
}

function SpanTree(props: { spans: Span[]; selected: string | null; onSelect: (id: string) => void }) {
  // Worked out once per answer of the store, not on each render (selecting a span renders the page again).
  const { rows, start, total } = useMemo(() => {
    let [first, last] = [Infinity, -Infinity];
    for (const s of props.spans)
      for (const t of [s.start_time, s.end_time])
        if (t !== null && Number.isFinite(t)) [first, last] = [Math.min(first, t), Math.max(last, t)];
    if (first > last) [first, last] = [0, 1];
    const rows = spanTree(props.spans).map((row) => ({ ...row, kind: spanKind(row.span), reward: rewards(row.span)[0] }));
    return { rows, start: first, total: Math.max(last - first, 1e-6) };
  }, [props.spans]);
  return (
    <div class="span-tree">
      <div class="span-axis" aria-hidden="true">
        <span>0</span>
        <span>{formatDuration(total / 2)}</span>
        <span>{formatDuration(total)}</span>
      </div>
      <ul role="tree" aria-label="span tree">
        {rows.map(({ span, depth, childCount, kind, reward }) => {
          const s = span.start_time ?? start;
          const e = span.end_time ?? s;
          return (
            <li
              key={span.span_id}
              role="treeitem"
              aria-level={depth + 1}
              aria-selected={span.span_id === props.selected}
              aria-expanded={childCount ? true : undefined}
              class={`span-row kind-${kind} ${span.span_id === props.selected ? "selected" : ""}`}
            >
              <button type="button" class="span-button" onClick={() => props.onSelect(span.span_id)} data-span-id={span.span_id}>
                <span class="span-name" style={{ paddingLeft: `${Math.min(depth, MAX_INDENT_LEVELS) * 14}px` }}>
                  <span class={`kind-dot kind-${kind}`} aria-hidden="true" />
                  {span.name}
                  {typeof span.attributes?.["agentlightning.operation.name"] === "string" && (
                    <span class="muted"> · {span.attributes["agentlightning.operation.name"] as string}</span>
                  )}
                  {reward && <span class="badge reward-badge">reward {formatNumber(reward.value)}</span>}
                </span>
                <span class="span-bar-track" aria-hidden="true">
                  <span
                    class={`span-bar kind-${kind}`}
                    style={{ left: `${((s - start) / total) * 100}%`, width: `${Math.max(((e - s) / total) * 100, 0.4)}%` }}
                  />
                </span>
                <span class="span-duration">{formatDuration(e - s)}</span>
              </button>
            </li>
          );
        })}
      </ul>
    </div>
  );
}

function SpanDetails(props: { span: Span; spans: Span[]; onSelect: (id: string) => void }) {
  const { span } = props;
  const call = llmCall(span);
  const found = rewards(span);
  const links = linkedSpans(span, props.spans);
  const spanTags = tags(span);
  return (
    <div>
      <h3>
        <Truncated text={span.name} limit={300} label="the span name" />
      </h3>
      <KeyValues
        label="span"
        rows={[
          ["Span", <span class="mono">{span.span_id}</span>],
          ["Parent", span.parent_id ? <span class="mono">{span.parent_id}</span> : "none"],
          ["Sequence", String(span.sequence_id)],
          ["Duration", formatDuration((span.end_time ?? 0) - (span.start_time ?? 0))],
          ["Status", `${span.status?.status_code ?? "UNSET"}${span.status?.description ? `: ${span.status.description}` : ""}`],
          ...(spanTags.length ? ([["Tags", spanTags.join(", ")]] as Array<[string, string]>) : []),
        ]}
      />
      {found.length > 0 && (
        <section aria-label="rewards">
          <h4>Rewards</h4>
          <KeyValues label="rewards" rows={found.map((r, i) => [i === 0 ? `${r.name} (primary)` : r.name, formatNumber(r.value, 4)])} />
        </section>
      )}
      {call && <LlmCallView call={call} />}
      {links.length > 0 && (
        <section aria-label="links">
          <h4>Linked spans</h4>
          <ul>
            {links.map((l) => (
              <li key={l.span_id}>
                <button type="button" class="link-button" onClick={() => props.onSelect(l.span_id)}>
                  {l.name} <span class="mono muted">{l.span_id}</span>
                </button>
              </li>
            ))}
          </ul>
        </section>
      )}
      {span.events?.length > 0 && (
        <section aria-label="events">
          <h4>Events</h4>
          <TextBlock value={span.events} label="the events" />
        </section>
      )}
      <details open={!call}>
        <summary>All attributes ({Object.keys(span.attributes ?? {}).length})</summary>
        <table class="kv attributes" aria-label="attributes">
          <tbody>
            {Object.entries(span.attributes ?? {}).map(([key, value]) => (
              <tr key={key}>
                <th scope="row" class="mono">
                  {key}
                </th>
                <td>
                  <pre class="text-block">
                    <Truncated text={toText(value)} limit={2000} label={key} />
                  </pre>
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      </details>
    </div>
  );
}

function Message(props: { message: ChatMessage; index: number; response?: boolean }) {
  const m = props.message;
  return (
    <li class={`message role-${m.role ?? "unknown"}`}>
      <div class="message-head">
        <strong>{m.role ?? "?"}</strong>
        {m.name && <span class="muted"> ({m.name})</span>}
        {m.tool_call_id && <span class="muted mono"> tool call {m.tool_call_id}</span>}
      </div>
      {m.content !== undefined && m.content !== null && m.content !== "" && <TextBlock value={m.content} label={`message ${props.index}`} />}
      {m.tool_calls !== undefined && m.tool_calls !== null && (
        <div class="tool-calls">
          <span class="muted">tool calls</span>
          <TextBlock value={m.tool_calls} label="the tool calls" />
        </div>
      )}
    </li>
  );
}

function TokenList(props: { label: string; ids: number[]; logprobs?: number[] | null }) {
  const shown = props.ids.slice(0, 400);
  return (
    <details>
      <summary>
        {props.label} ({props.ids.length})
      </summary>
      <ol class="tokens" aria-label={props.label}>
        {shown.map((id, i) => (
          <li key={i} title={props.logprobs && props.logprobs[i] !== undefined ? `logprob ${props.logprobs[i].toFixed(4)}` : undefined}>
            <span class="mono">{id}</span>
            {props.logprobs && props.logprobs[i] !== undefined && <span class="logprob">{props.logprobs[i].toFixed(3)}</span>}
          </li>
        ))}
      </ol>
      {props.ids.length > shown.length && <p class="muted">… and {props.ids.length - shown.length} more (see the attributes)</p>}
    </details>
  );
}

function LlmCallView(props: { call: LlmCall }) {
  const c = props.call;
  return (
    <section aria-label="LLM call" class="llm-call">
      <h4>LLM call{c.model ? ` to ${c.model}` : ""}</h4>
      <KeyValues
        label="token counts"
        rows={[
          ["Prompt tokens", formatNumber(c.inputTokens ?? c.promptTokenIds?.length ?? null)],
          ["Response tokens", formatNumber(c.outputTokens ?? c.responseTokenIds?.length ?? null)],
          ["Finish", c.finishReasons?.join(", ") ?? "–"],
          ["Streamed", c.stream === null ? "–" : c.stream ? "yes" : "no"],
          ["Token ids recorded", c.promptTokenIds || c.responseTokenIds ? "yes" : "no"],
          ["Logprobs recorded", c.logprobs ? "yes" : "no"],
        ]}
      />
      {c.tools !== null && c.tools !== undefined && (
        <details>
          <summary>Tools offered</summary>
          <TextBlock value={c.tools} label="the tools" />
        </details>
      )}
      <h5>Messages</h5>
      <ol class="messages">
        {c.messages.map((m, i) => (
          <Message key={i} message={m} index={i} />
        ))}
      </ol>
      <h5>Response</h5>
      <ol class="messages response">
        {c.completions.map((m, i) => (
          <Message key={i} message={m} index={i} response />
        ))}
      </ol>
      {c.promptTokenIds && <TokenList label="Prompt token ids" ids={c.promptTokenIds} />}
      {c.responseTokenIds && <TokenList label="Response token ids and logprobs" ids={c.responseTokenIds} logprobs={c.logprobs} />}
    </section>
  );
}
