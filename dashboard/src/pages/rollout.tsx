// A rollout: its attempts on a timeline (with why each retry happened), its input, its final reward, and the trace
// of the selected attempt.
import { api, type Attempt, type Rollout } from "../api";
import { serverNow } from "../clock";
import { ErrorNote, KeyValues, Link, Loading, NotFound, StatusBadge, TextBlock, Truncated } from "../components/common";
import { formatAge, formatDuration, formatReward, formatTime } from "../format";
import { useData } from "../hooks";
import { navigate, type Location } from "../router";
import { finalReward, REWARD_SPAN_NAME } from "../spans";
import { TraceView } from "./trace";

const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
/** Attempt statuses of an attempt still at work: its duration runs up to now. */
const ACTIVE_ATTEMPT = new Set(["preparing", "running"]);
/** Characters of an attempt's metadata shown in the attempts table before "show all". */
const OUTCOME_PREVIEW_CHARS = 160;

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
              ["Duration", rolloutDuration(r)],
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

/** How long the rollout took, or, while it has not ended, how long it has been going by the server's clock. */
function rolloutDuration(r: Rollout): string {
  if (r.end_time !== null) return formatDuration(r.end_time - r.start_time);
  const soFar = formatDuration(serverNow() - r.start_time);
  return `${soFar} (${r.status === "preparing" ? "running" : r.status})`;
}

function attemptRunning(a: Attempt): boolean {
  return a.end_time === null && ACTIVE_ATTEMPT.has(a.status);
}

/** When the attempt ended: for one still at work, now (by the server's clock); for one that went silent without an
 * end, its last heartbeat. */
function attemptEnd(a: Attempt): number {
  if (a.end_time !== null) return a.end_time;
  if (attemptRunning(a)) return serverNow();
  return a.last_heartbeat_time ?? serverNow();
}

function attemptDuration(a: Attempt): string {
  return formatDuration(attemptEnd(a) - a.start_time) + (attemptRunning(a) ? " (running)" : "");
}

const RETRY_CAUSE: Record<string, string> = {
  failed: "the agent raised an error",
  timeout: "the attempt ran past the rollout's timeout",
  unresponsive: "no heartbeat or span within the unresponsive limit",
};

/** Why an attempt was followed by another: told by the next attempt, or, before it exists, by the rollout's status
 * (`requeuing`: the store has put the rollout back in the queue for another attempt). */
function retryReason(rollout: Rollout, a: Attempt, next: Attempt | undefined, latest: boolean): string {
  const why = RETRY_CAUSE[a.status] ?? a.status;
  if (next) return `retried as attempt ${next.sequence_id}: ${why}`;
  if (latest && rollout.status === "requeuing" && !attemptRunning(a)) return `will be retried: ${why}`;
  return "";
}

/** An attempt's metadata in one line, cut to a preview with a button showing it all. */
function Outcome(props: { attempt: Attempt; reason: string }) {
  const { metadata } = props.attempt;
  const hasMetadata = metadata !== null && typeof metadata === "object" && Object.keys(metadata).length > 0;
  return (
    <>
      {props.reason && <span class="retry-reason">{props.reason}</span>}
      {hasMetadata && (
        <div class="mono">
          <Truncated
            text={JSON.stringify(metadata)}
            limit={OUTCOME_PREVIEW_CHARS}
            label={`the metadata of attempt ${props.attempt.sequence_id}`}
          />
        </div>
      )}
    </>
  );
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
            <td class="num">{attemptDuration(a)}</td>
            <td>{formatAge(a.last_heartbeat_time)}</td>
            <td class="outcome">
              <Outcome attempt={a} reason={retryReason(props.rollout, a, props.attempts[i + 1], i === props.attempts.length - 1)} />
            </td>
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
                title={`attempt ${a.sequence_id}: ${a.status}, ${attemptDuration(a)}`}
                aria-label={`attempt ${a.sequence_id}, ${a.status}, ${attemptDuration(a)}`}
                onClick={() => navigate(`/rollouts/${encodeURIComponent(a.rollout_id)}/attempts/${encodeURIComponent(a.attempt_id)}`)}
              />
            </div>
          </div>
        );
      })}
    </div>
  );
}
