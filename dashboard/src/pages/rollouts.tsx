// Rollouts: a filterable, sortable, paginated table, refreshed live; the filters live in the URL.
import { useEffect, useState } from "preact/hooks";
import { api, validationIssues, type ApiError, type Query } from "../api";
import { ErrorNote, Link, Loading, Pagination, StatusBadge } from "../components/common";
import { toServerTime } from "../clock";
import { formatClock, formatDuration, formatReward, formatTime, zoneOf } from "../format";
import { useData } from "../hooks";
import { navigate, withQuery, type Location } from "../router";

export const STATUSES = ["queuing", "preparing", "running", "requeuing", "succeeded", "failed", "cancelled"];
const MODES = ["train", "val", "test", "none"];
const PAGE_SIZES = [25, 50, 100, 200];

const COLUMNS: Array<{ key: string; label: string; sort?: string }> = [
  { key: "rollout_id", label: "Rollout", sort: "rollout_id" },
  { key: "status", label: "Status", sort: "status" },
  { key: "mode", label: "Mode", sort: "mode" },
  { key: "input", label: "Input" },
  { key: "reward", label: "Reward", sort: "reward" },
  { key: "attempts", label: "Attempts" },
  { key: "worker", label: "Worker" },
  { key: "start_time", label: "Started", sort: "start_time" },
  { key: "duration", label: "Duration", sort: "duration" },
  { key: "resources_id", label: "Resources", sort: "resources_id" },
];

const FILTER_KEYS = ["status", "mode", "resources_id", "worker_id", "text", "reward_min", "reward_max", "start_after", "start_before"];

/** The address's name of each parameter of `GET dashboard/rollouts` named otherwise there. */
const ADDRESS_NAME: Record<string, string> = { sort_by: "sort", sort_order: "order", limit: "size" };

/** A parameter of the address left out because it is not valid: `index` picks one value of a repeated one. */
interface Dropped {
  name: string;
  value: string;
  index?: number;
  why: string;
}

function toEpoch(local: string | null): number | undefined {
  if (!local) return undefined;
  const t = new Date(local).getTime();
  return Number.isFinite(t) ? t / 1000 : undefined;
}

/**
 * The query of the address, and what of it is not valid. The store's own validation decides which sorts, orders,
 * statuses, modes and numbers are valid (its 422 names each refused value, see `refusedByTheStore`), so the allowed
 * values are written down once, in the store. Checked here: what the page itself reads (the page size, the local
 * times), and the two ranges the store refuses with a 400 that names no parameter.
 */
function readQuery(params: URLSearchParams): { query: Query; invalid: Dropped[] } {
  const invalid: Dropped[] = [];
  const size = params.get("size");
  if (size !== null && !PAGE_SIZES.includes(Number(size)))
    invalid.push({ name: "size", value: size, why: `rows per page are ${PAGE_SIZES.join(", ")}` });
  const times: Record<string, number | undefined> = {};
  for (const name of ["start_after", "start_before"]) {
    const value = params.get(name);
    times[name] = toEpoch(value);
    if (value && times[name] === undefined) invalid.push({ name, value, why: "not a date and time" });
  }
  if (times.start_after !== undefined && times.start_before !== undefined && times.start_after > times.start_before) {
    for (const name of ["start_after", "start_before"])
      invalid.push({ name, value: params.get(name)!, why: "start_after is later than start_before" });
  }
  const [rewardMin, rewardMax] = [params.get("reward_min"), params.get("reward_max")];
  if (rewardMin && rewardMax && Number(rewardMin) > Number(rewardMax)) {
    invalid.push({ name: "reward_min", value: rewardMin, why: "reward_min is above reward_max" });
    invalid.push({ name: "reward_max", value: rewardMax, why: "reward_min is above reward_max" });
  }
  const left = new Set(invalid.map((d) => d.name));
  const take = (name: string) => (left.has(name) ? null : params.get(name));
  const query: Query = {
    status: params.getAll("status"),
    mode: params.getAll("mode"),
    resources_id: params.get("resources_id"),
    worker_id: params.get("worker_id"),
    text: params.get("text"),
    reward_min: take("reward_min"),
    reward_max: take("reward_max"),
    start_after: left.has("start_after") ? undefined : times.start_after,
    start_before: left.has("start_before") ? undefined : times.start_before,
    sort_by: params.get("sort") ?? "start_time",
    sort_order: params.get("order") ?? "desc",
    limit: left.has("size") || size === null ? 50 : Number(size),
    offset: params.get("offset"),
  };
  return { query, invalid };
}

/** The parameters of the address the store refused (422), each with the store's reason. */
function refusedByTheStore(error: ApiError | null, params: URLSearchParams): Dropped[] {
  if (!error) return [];
  const dropped: Dropped[] = [];
  for (const issue of validationIssues(error)) {
    const [where, field, index] = issue.loc;
    if (where !== "query" || typeof field !== "string") continue;
    const name = ADDRESS_NAME[field] ?? field;
    const values = params.getAll(name);
    const value = typeof index === "number" ? values[index] : values[0];
    if (value !== undefined) dropped.push({ name, value, index: typeof index === "number" ? index : undefined, why: issue.msg });
  }
  return dropped;
}

/** `params` without the dropped values. */
function without(params: URLSearchParams, dropped: Dropped[]): URLSearchParams {
  const next = new URLSearchParams();
  const seen: Record<string, number> = {};
  for (const [name, value] of params) {
    const index = (seen[name] = (seen[name] ?? -1) + 1);
    if (!dropped.some((d) => d.name === name && (d.index === undefined || d.index === index))) next.append(name, value);
  }
  return next;
}

function DroppedNotice(props: { dropped: Dropped[]; onDismiss: () => void }) {
  if (!props.dropped.length) return null;
  return (
    <div class="notice" role="status" aria-label="parameters left out">
      Left out of the address, as not valid:
      <ul>
        {props.dropped.map((d, i) => (
          <li key={i}>
            <code>
              {d.name}={d.value}
            </code>{" "}
            ({d.why})
          </li>
        ))}
      </ul>
      <button type="button" class="secondary" onClick={props.onDismiss}>
        Dismiss
      </button>
    </div>
  );
}

export function RolloutsPage(props: { location: Location }) {
  const params = props.location.params;
  const status = params.getAll("status");
  const { query, invalid } = readQuery(params);
  const sortBy = String(query.sort_by);
  const order = query.sort_order === "asc" ? "asc" : "desc";
  const key = JSON.stringify(query);
  const { data, error, updatedAt } = useData(() => api.rollouts(query), key);
  const refused = refusedByTheStore(error, params);
  // What a shared link holds that is not valid is left out of the address, with a notice naming it, and the page
  // loads without it; the store still refuses it (a 4xx) to API clients.
  const [dropped, setDropped] = useState<Dropped[]>([]);
  const leaveOut = invalid.length ? invalid : refused;
  useEffect(() => {
    if (!leaveOut.length) return;
    setDropped((before) => [...before, ...leaveOut]);
    const text = without(params, leaveOut).toString();
    navigate(text ? `/rollouts?${text}` : "/rollouts", { replace: true });
  }, [params.toString(), error]);

  const update = (changes: Record<string, string | string[] | null>, keepOffset = false) => {
    setDropped([]);
    const next = new URLSearchParams(params);
    for (const [k, v] of Object.entries(changes)) {
      next.delete(k);
      if (Array.isArray(v)) v.forEach((item) => next.append(k, item));
      else if (v !== null && v !== "") next.set(k, v);
    }
    if (!keepOffset) next.delete("offset");
    const text = next.toString();
    navigate(text ? `/rollouts?${text}` : "/rollouts", { replace: true });
  };

  const toggleSort = (column: string) => update({ sort: column, order: sortBy === column && order === "desc" ? "asc" : "desc" }, false);

  return (
    <section aria-labelledby="rollouts-title">
      <div class="page-head">
        <h1 id="rollouts-title">Rollouts</h1>
        <span class="muted live" aria-live="off">
          {updatedAt ? `updated ${formatClock(toServerTime(updatedAt))}` : ""}
        </span>
      </div>
      <StatusChips counts={data?.counts} selected={status} onSelect={(s) => update({ status: s })} />
      <Filters params={params} onChange={update} />
      <DroppedNotice dropped={dropped} onDismiss={() => setDropped([])} />
      <ErrorNote error={refused.length ? null : error} what="the rollouts" />
      {!data && (!error || refused.length > 0) && <Loading what="rollouts" />}
      {data && (
        <>
          <div class="table-wrap">
            <table class="rollouts" aria-label="rollouts">
              <thead>
                <tr>
                  {COLUMNS.map((c) => (
                    <th
                      key={c.key}
                      scope="col"
                      aria-sort={c.sort && c.sort === sortBy ? (order === "asc" ? "ascending" : "descending") : undefined}
                    >
                      {c.sort ? (
                        <button type="button" class="sort" onClick={() => toggleSort(c.sort!)}>
                          {c.label}
                          <span aria-hidden="true">{c.sort === sortBy ? (order === "asc" ? " ▲" : " ▼") : ""}</span>
                        </button>
                      ) : (
                        c.label
                      )}
                    </th>
                  ))}
                </tr>
              </thead>
              <tbody>
                {data.items.map((r) => (
                  <tr key={r.rollout_id} data-rollout-id={r.rollout_id}>
                    <td>
                      <Link to={`/rollouts/${encodeURIComponent(r.rollout_id)}`} class="mono">
                        {r.rollout_id}
                      </Link>
                    </td>
                    <td>
                      <StatusBadge status={r.status} />
                    </td>
                    <td>{r.mode ?? "–"}</td>
                    <td class="input-preview" title={r.input_preview}>
                      {r.input_preview}
                    </td>
                    <td class="num">{formatReward(r.reward)}</td>
                    <td class="num">{r.attempt?.sequence_id ?? 0}</td>
                    <td class="mono clip" title={r.attempt?.worker_id ?? undefined}>
                      {r.attempt?.worker_id ?? "–"}
                    </td>
                    <td>{formatTime(r.start_time)}</td>
                    <td class="num">{formatDuration(r.duration)}</td>
                    <td class="mono clip" title={r.resources_id ?? undefined}>
                      {r.resources_id ? <Link to={`/resources/${encodeURIComponent(r.resources_id)}`}>{r.resources_id}</Link> : "–"}
                    </td>
                  </tr>
                ))}
              </tbody>
            </table>
            {!data.items.length &&
              (data.total > 0 ? (
                <p class="muted empty">
                  This page is past the last of the {data.total.toLocaleString()} rollouts that match.{" "}
                  <button
                    type="button"
                    class="link-button"
                    onClick={() => update({ offset: String(Math.floor((data.total - 1) / data.limit) * data.limit) }, true)}
                  >
                    Go to the last page
                  </button>
                </p>
              ) : (
                <p class="muted empty">No rollout matches.</p>
              ))}
          </div>
          <div class="table-foot">
            <Pagination total={data.total} offset={data.offset} limit={data.limit} onPage={(o) => update({ offset: String(Math.max(0, o)) }, true)} />
            <label>
              Rows per page{" "}
              <select value={String(data.limit)} onChange={(e) => update({ size: (e.target as HTMLSelectElement).value })}>
                {PAGE_SIZES.map((s) => (
                  <option key={s} value={String(s)}>
                    {s}
                  </option>
                ))}
              </select>
            </label>
          </div>
        </>
      )}
    </section>
  );
}

function StatusChips(props: { counts?: Record<string, number>; selected: string[]; onSelect: (s: string[]) => void }) {
  return (
    <div class="chips" role="group" aria-label="filter by status">
      <button type="button" class={`chip ${props.selected.length ? "" : "active"}`} aria-pressed={!props.selected.length} onClick={() => props.onSelect([])}>
        all {props.counts ? `(${Object.values(props.counts).reduce((a, b) => a + b, 0).toLocaleString()})` : ""}
      </button>
      {STATUSES.map((s) => {
        const active = props.selected.includes(s);
        return (
          <button
            key={s}
            type="button"
            class={`chip status-${s} ${active ? "active" : ""}`}
            aria-pressed={active}
            onClick={() => props.onSelect(active ? props.selected.filter((x) => x !== s) : [...props.selected, s])}
          >
            {s} {props.counts ? `(${(props.counts[s] ?? 0).toLocaleString()})` : ""}
          </button>
        );
      })}
    </div>
  );
}

function Filters(props: { params: URLSearchParams; onChange: (changes: Record<string, string | string[] | null>) => void }) {
  const [draft, setDraft] = useState<Record<string, string>>({});
  useEffect(() => {
    const values: Record<string, string> = {};
    for (const k of FILTER_KEYS) if (k !== "status" && k !== "mode") values[k] = props.params.get(k) ?? "";
    setDraft(values);
  }, [props.params.toString()]);
  const set = (k: string) => (e: Event) => setDraft({ ...draft, [k]: (e.target as HTMLInputElement).value });
  const modes = props.params.getAll("mode");
  const active = FILTER_KEYS.some((k) => props.params.getAll(k).length);
  return (
    <form
      class="filters"
      aria-label="rollout filters"
      onSubmit={(e) => {
        e.preventDefault();
        props.onChange(draft);
      }}
    >
      <label>
        Search input or id
        <input type="search" value={draft.text ?? ""} onInput={set("text")} placeholder="text in the input" />
      </label>
      <fieldset class="modes">
        <legend>Mode</legend>
        {MODES.map((m) => (
          <label key={m} class="inline">
            <input
              type="checkbox"
              checked={modes.includes(m)}
              onChange={() => props.onChange({ mode: modes.includes(m) ? modes.filter((x) => x !== m) : [...modes, m] })}
            />
            {m}
          </label>
        ))}
      </fieldset>
      <label>
        Worker
        <input value={draft.worker_id ?? ""} onInput={set("worker_id")} placeholder="worker id" />
      </label>
      <label>
        Resources
        <input value={draft.resources_id ?? ""} onInput={set("resources_id")} placeholder="rs-…" />
      </label>
      <label>
        Reward ≥
        <input type="number" step="any" value={draft.reward_min ?? ""} onInput={set("reward_min")} class="short" />
      </label>
      <label>
        Reward ≤
        <input type="number" step="any" value={draft.reward_max ?? ""} onInput={set("reward_max")} class="short" />
      </label>
      <label>
        Started after ({zoneOf()})
        <input type="datetime-local" step="1" value={draft.start_after ?? ""} onInput={set("start_after")} />
      </label>
      <label>
        Started before ({zoneOf()})
        <input type="datetime-local" step="1" value={draft.start_before ?? ""} onInput={set("start_before")} />
      </label>
      <div class="filter-actions">
        <button type="submit">Apply filters</button>
        {active && (
          <button type="button" class="secondary" onClick={() => navigate(withQuery("/rollouts", {}), { replace: true })}>
            Clear
          </button>
        )}
      </div>
    </form>
  );
}
