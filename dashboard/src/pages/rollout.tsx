// A rollout: its attempts on a timeline (with why each retry happened), its input, its final reward, and the trace
// of the selected attempt.
import { api, type Attempt, type Rollout } from "../api";
import { ErrorNote, KeyValues, Link, Loading, NotFound, StatusBadge, TextBlock } from "../components/common";
import { formatAge, formatDuration, formatReward, formatTime } from "../format";
import { useData } from "../hooks";
import { navigate, type Location } from "../router";
import { finalReward, REWARD_SPAN_NAME } from "../spans";
import { TraceView } from "./trace";

const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);

export function RolloutPage(props: { rolloutId: string; attemptId?: string; location: Location }) {
  const { rolloutId } = props;
  const rollout = useData(() => api.rollout(rolloutId), `rollout:${rolloutId}`);
  const attempts = useData(() => api.attempts(rolloutId), `attempts:${rolloutId}`);
  if (rollout.data === null) {
    return (
      <NotFound title="Rollout not found">
        <p>
          The store has no rollout with id <code>{rolloutId}</code>.
        </p>
      </NotFound>
    );
  }
  if (!rollout.data) {
    return (
      <>
        <ErrorNote error={rollout.error} what={`rollout ${rolloutId}`} />
        {!rollout.error && <Loading what={`rollout ${rolloutId}`} />}
      </>
    );
  }
  const r = rollout.data;
  const list = attempts.data?.items ?? [];
  const selected =
    (props.attemptId && list.find((a) => a.attempt_id === props.attemptId)) || r.attempt || list[list.length - 1] || undefined;
  if (props.attemptId && attempts.data && !list.find((a) => a.attempt_id === props.attemptId)) {
    return (
      <NotFound title="Attempt not found">
        <p>
          Rollout <Link to={`/rollouts/${encodeURIComponent(rolloutId)}`}>{rolloutId}</Link> has no attempt <code>{props.attemptId}</code>.
        </p>
      </NotFound>
    );
  }
  return (
    <article aria-labelledby="rollout-title" class="rollout">
      <div class="page-head">
        <h1 id="rollout-title">
          Rollout <span class="mono">{r.rollout_id}</span>
        </h1>
        <StatusBadge status={r.status} />
      </div>
      <div class="columns">
        <section aria-labelledby="summary-title" class="card">
          <h2 id="summary-title">Summary</h2>
          <KeyValues
            label="rollout summary"
            rows={[
              ["Status", <StatusBadge status={r.status} />],
              ["Mode", r.mode ?? "–"],
              ["Final reward", <FinalReward rollout={r} attempt={selected} />],
              ["Started", formatTime(r.start_time)],
              ["Ended", formatTime(r.end_time)],
              ["Duration", formatDuration((r.end_time ?? Date.now() / 1000) - r.start_time) + (r.end_time ? "" : " (running)")],
              ["Resources", r.resources_id ? <Link to={`/resources/${encodeURIComponent(r.resources_id)}`}>{r.resources_id}</Link> : "latest"],
              ["Attempts", `${list.length} of at most ${r.config.max_attempts}`],
              ["Retried on", r.config.retry_condition.length ? r.config.retry_condition.join(", ") : "never"],
              ["Timeout", r.config.timeout_seconds ? formatDuration(r.config.timeout_seconds) : "none"],
            ]}
          />
          {r.metadata && Object.keys(r.metadata).length > 0 && (
            <>
              <h3>Metadata</h3>
              <TextBlock value={r.metadata} label="metadata" />
            </>
          )}
        </section>
        <section aria-labelledby="input-title" class="card">
          <h2 id="input-title">Input</h2>
          <TextBlock value={r.input} label="the input" />
        </section>
      </div>
      <section aria-labelledby="attempts-title" class="card">
        <h2 id="attempts-title">Attempts</h2>
        <ErrorNote error={attempts.error} what="the attempts" />
        <AttemptTimeline rollout={r} attempts={list} selected={selected?.attempt_id} />
        <AttemptTable rollout={r} attempts={list} selected={selected?.attempt_id} />
      </section>
      {selected && (
        <TraceView key={selected.attempt_id} rollout={r} attempt={selected} location={props.location} live={!TERMINAL.has(r.status)} />
      )}
    </article>
  );
}

/** The attempt's last reward, read from its reward spans as the store reads it for the rollout lists (an attempt may
 * hold many other spans, which are not read for it). */
function FinalReward(props: { rollout: Rollout; attempt?: Attempt }) {
  const { rollout, attempt } = props;
  const spans = useData(
    () => (attempt ? api.spans(rollout.rollout_id, attempt.attempt_id, { name: REWARD_SPAN_NAME }) : Promise.resolve(null)),
    `reward:${rollout.rollout_id}:${attempt?.attempt_id}`,
    !TERMINAL.has(rollout.status),
  );
  if (!spans.data) return <span class="muted">–</span>;
  const value = finalReward(spans.data.items);
  return <strong class="reward">{value === null ? "none recorded" : formatReward(value)}</strong>;
}

function attemptEnd(a: Attempt): number {
  return a.end_time ?? a.last_heartbeat_time ?? Date.now() / 1000;
}

function retryReason(a: Attempt, next: Attempt | undefined): string {
  if (!next) return "";
  const why: Record<string, string> = {
    failed: "the agent raised an error",
    timeout: "the attempt ran past the rollout's timeout",
    unresponsive: "no heartbeat or span within the unresponsive limit",
  };
  return `retried as attempt ${next.sequence_id}: ${why[a.status] ?? a.status}`;
}

function AttemptTable(props: { rollout: Rollout; attempts: Attempt[]; selected?: string }) {
  return (
    <table class="attempts" aria-label="attempts">
      <thead>
        <tr>
          <th scope="col">#</th>
          <th scope="col">Attempt</th>
          <th scope="col">Status</th>
          <th scope="col">Worker</th>
          <th scope="col">Started</th>
          <th scope="col">Duration</th>
          <th scope="col">Last heartbeat</th>
          <th scope="col">Outcome</th>
        </tr>
      </thead>
      <tbody>
        {props.attempts.map((a, i) => (
          <tr key={a.attempt_id} class={a.attempt_id === props.selected ? "selected" : ""}>
            <td class="num">{a.sequence_id}</td>
            <td>
              <Link to={`/rollouts/${encodeURIComponent(a.rollout_id)}/attempts/${encodeURIComponent(a.attempt_id)}`} class="mono">
                {a.attempt_id}
              </Link>
            </td>
            <td>
              <StatusBadge status={a.status} />
            </td>
            <td class="mono">
              {a.worker_id ? <Link to={`/workers?worker=${encodeURIComponent(a.worker_id)}`}>{a.worker_id}</Link> : "–"}
            </td>
            <td>{formatTime(a.start_time)}</td>
            <td class="num">{formatDuration(attemptEnd(a) - a.start_time)}</td>
            <td>{formatAge(a.last_heartbeat_time)}</td>
            <td>{retryReason(a, props.attempts[i + 1]) || (a.metadata && Object.keys(a.metadata).length ? JSON.stringify(a.metadata) : "")}</td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

function AttemptTimeline(props: { rollout: Rollout; attempts: Attempt[]; selected?: string }) {
  const { rollout, attempts } = props;
  if (!attempts.length) return <p class="muted">No attempt yet: the rollout is {rollout.status}.</p>;
  const start = rollout.start_time;
  const end = Math.max(rollout.end_time ?? 0, ...attempts.map(attemptEnd));
  const span = Math.max(end - start, 1e-3);
  return (
    <div class="timeline" role="list" aria-label="attempt timeline">
      <div class="timeline-axis" aria-hidden="true">
        <span>{formatTime(start)}</span>
        <span>+{formatDuration(span)}</span>
      </div>
      {attempts.map((a) => {
        const left = ((a.start_time - start) / span) * 100;
        const width = Math.max(((attemptEnd(a) - a.start_time) / span) * 100, 0.5);
        return (
          <div role="listitem" key={a.attempt_id} class="timeline-row">
            <span class="timeline-label">#{a.sequence_id}</span>
            <div class="timeline-track">
              <button
                type="button"
                class={`timeline-bar status-${a.status} ${a.attempt_id === props.selected ? "selected" : ""}`}
                style={{ left: `${left}%`, width: `${width}%` }}
                title={`attempt ${a.sequence_id}: ${a.status}, ${formatDuration(attemptEnd(a) - a.start_time)}`}
                aria-label={`attempt ${a.sequence_id}, ${a.status}, ${formatDuration(attemptEnd(a) - a.start_time)}`}
                onClick={() => navigate(`/rollouts/${encodeURIComponent(a.rollout_id)}/attempts/${encodeURIComponent(a.attempt_id)}`)}
              />
            </div>
          </div>
        );
      })}
    </div>
  );
}
