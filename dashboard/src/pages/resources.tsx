// Resources: every version the store holds (prompt templates, LLM endpoints), one version's content, a diff between
// two versions, and how the rollouts that used each version scored, per purpose, as the prompt optimizers score a
// candidate.
import { api, request, type ResourcesUpdate } from "../api";
import { ErrorNote, KeyValues, Link, Loading, NotFound, TextBlock } from "../components/common";
import { diffLines } from "../diff";
import { formatReward, formatTime, toText } from "../format";
import { useData } from "../hooks";
import { navigate, withQuery, type Location } from "../router";

/** The finished rollouts of a version run for one purpose of a prompt search (or, untagged, in one mode). */
interface PurposeScore {
  purpose: string | null; // "train", "val-batch", "val-full"...; null: no prompt optimizer tagged them
  mode: string | null;
  rollouts: number;
  with_reward: number; // succeeded with a finite reward; the others count 0
  score: number;
}

interface Score {
  resources_id: string;
  rollouts: number;
  by_purpose: PurposeScore[];
}

function purposeLabel(group: PurposeScore): string {
  return group.purpose ?? `${group.mode ?? "no"} mode`;
}

function Scores(props: { groups: PurposeScore[] }) {
  return (
    <ul class="scores">
      {props.groups.map((g) => (
        <li key={`${g.purpose}:${g.mode}`} title={`${g.with_reward} of ${g.rollouts} succeeded with a reward; the others count 0`}>
          <span class="score-purpose">{purposeLabel(g)}</span> <strong>{formatReward(g.score)}</strong>{" "}
          <span class="muted">
            over {g.rollouts} rollout{g.rollouts === 1 ? "" : "s"}
          </span>
        </li>
      ))}
    </ul>
  );
}

function describe(resource: Record<string, unknown> & { resource_type: string }): string {
  if (resource.resource_type === "prompt_template") return `prompt template (${resource.engine ?? "f-string"})`;
  if (resource.resource_type === "llm" || resource.resource_type === "proxy_llm") return `LLM ${resource.model ?? ""}`;
  return resource.resource_type;
}

export function ResourcesPage(props: { location: Location; resourcesId?: string }) {
  const list = useData(() => api.resources(), "resources");
  const scores = useData(() => request<{ items: Score[] }>("GET", "dashboard/resources"), "resource-scores");
  const compareA = props.location.params.get("compare");
  const compareB = props.location.params.get("with");
  const items = list.data?.items ?? [];
  const scoreOf = new Map((scores.data?.items ?? []).map((s) => [s.resources_id, s]));
  return (
    <section aria-labelledby="resources-title">
      <div class="page-head">
        <h1 id="resources-title">Resources</h1>
      </div>
      <ErrorNote error={list.error} what="the resources" />
      {!list.data && !list.error && <Loading what="resources" />}
      {list.data && !items.length && <p class="muted">No resources yet: an algorithm publishes them when a run starts.</p>}
      {items.length > 0 && (
        <div class="table-wrap">
          <table aria-label="resource versions">
            <thead>
              <tr>
                <th scope="col">Resources</th>
                <th scope="col">Version</th>
                <th scope="col">Contents</th>
                <th scope="col">Updated</th>
                <th scope="col">Rollouts</th>
                <th scope="col">Score per purpose</th>
                <th scope="col">Compare</th>
              </tr>
            </thead>
            <tbody>
              {items.map((r) => {
                const score = scoreOf.get(r.resources_id);
                return (
                  <tr key={r.resources_id} class={r.resources_id === props.resourcesId ? "selected" : ""}>
                    <td class="clip" title={r.resources_id}>
                      <Link to={`/resources/${encodeURIComponent(r.resources_id)}`} class="mono">
                        {r.resources_id}
                      </Link>
                    </td>
                    <td class="num">{r.version}</td>
                    <td>
                      {Object.entries(r.resources)
                        .map(([name, res]) => `${name}: ${describe(res)}`)
                        .join("; ")}
                    </td>
                    <td>{formatTime(r.update_time)}</td>
                    <td class="num">{score ? score.rollouts : "–"}</td>
                    <td>{score?.by_purpose.length ? <Scores groups={score.by_purpose} /> : "–"}</td>
                    <td>
                      <input
                        type="checkbox"
                        aria-label={`compare ${r.resources_id}`}
                        checked={compareA === r.resources_id || compareB === r.resources_id}
                        onChange={(e) => {
                          const on = (e.target as HTMLInputElement).checked;
                          let [a, b] = [compareA, compareB];
                          if (on) [a, b] = a ? [a, r.resources_id] : [r.resources_id, b];
                          else [a, b] = [a === r.resources_id ? b : a, b === r.resources_id ? null : b];
                          navigate(withQuery(props.location.path, { compare: a, with: a ? b : null }), { replace: true });
                        }}
                      />
                    </td>
                  </tr>
                );
              })}
            </tbody>
          </table>
        </div>
      )}
      {items.length > 0 && (
        <p class="muted footnote">
          Score: the mean over a version's finished rollouts, where failed, cancelled and unrewarded rollouts and NaN or
          infinite rewards count 0, as the prompt optimizers score a candidate. It is given per purpose of a prompt
          search (<code>val-full</code>, the whole validation set, decides the best prompt; <code>val-batch</code>,{" "}
          <code>train</code>...) and, for rollouts no optimizer tagged, per mode.
        </p>
      )}
      {compareA && compareB && <ResourceDiff a={compareA} b={compareB} />}
      {compareA && !compareB && <p class="muted">Tick a second version to compare it with {compareA}.</p>}
      {props.resourcesId && <ResourceDetail resourcesId={props.resourcesId} />}
    </section>
  );
}

function ResourceDetail(props: { resourcesId: string }) {
  const one = useData(() => api.resourcesById(props.resourcesId), `resource:${props.resourcesId}`, false);
  if (one.data === null)
    return (
      <NotFound title="Resources not found">
        <p>
          The store has no resources with id <code>{props.resourcesId}</code>.
        </p>
      </NotFound>
    );
  if (!one.data) return <ErrorNote error={one.error} what={props.resourcesId} />;
  const r = one.data;
  return (
    <section class="card" aria-labelledby="resource-title">
      <h2 id="resource-title">
        <span class="mono">{r.resources_id}</span> (version {r.version})
      </h2>
      <p class="muted">
        created {formatTime(r.create_time)}, updated {formatTime(r.update_time)} ·{" "}
        <Link to={withQuery("/rollouts", { resources_id: r.resources_id })}>rollouts that used it</Link>
      </p>
      {Object.entries(r.resources).map(([name, res]) => (
        <div key={name} class="resource">
          <h3>
            {name} <span class="muted">{describe(res)}</span>
          </h3>
          {res.resource_type === "prompt_template" ? (
            <TextBlock value={res.template} label={`template ${name}`} />
          ) : (
            <KeyValues
              label={name}
              rows={Object.entries(res)
                .filter(([k]) => k !== "resource_type" && k !== "api_key")
                .map(([k, v]) => [k, <span class="mono">{toText(v)}</span>])}
            />
          )}
        </div>
      ))}
    </section>
  );
}

function comparable(r: ResourcesUpdate): string {
  return Object.entries(r.resources)
    .sort(([a], [b]) => a.localeCompare(b))
    .map(([name, res]) => {
      const { template, api_key: _hidden, ...rest } = res as Record<string, unknown>;
      void _hidden;
      const body = typeof template === "string" ? `${toText(rest)}\n${template}` : toText(rest);
      return `## ${name}\n${body}`;
    })
    .join("\n\n");
}

function ResourceDiff(props: { a: string; b: string }) {
  const pair = useData(
    () => Promise.all([api.resourcesById(props.a), api.resourcesById(props.b)]),
    `diff:${props.a}:${props.b}`,
    false,
  );
  if (!pair.data) return <ErrorNote error={pair.error} what="the versions to compare" />;
  const [a, b] = pair.data;
  if (!a || !b) return <p class="error-note">One of the versions no longer exists.</p>;
  const lines = diffLines(comparable(a), comparable(b));
  return (
    <section class="card" aria-labelledby="diff-title">
      <h2 id="diff-title">
        <span class="mono">{a.resources_id}</span> → <span class="mono">{b.resources_id}</span>
      </h2>
      <pre class="diff" aria-label="differences">
        {lines.map((l, i) => (
          <div key={i} class={`diff-${l.op}`}>
            <span aria-hidden="true">{l.op === "add" ? "+ " : l.op === "remove" ? "- " : "  "}</span>
            <span class="sr-only">{l.op === "add" ? "added: " : l.op === "remove" ? "removed: " : ""}</span>
            {l.text}
          </div>
        ))}
      </pre>
    </section>
  );
}
