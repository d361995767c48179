// Workers: status, heartbeat age, current rollout, throughput, and their last system snapshot.
import { api } from "../api";
import { ErrorNote, Link, Loading, StatusBadge, TextBlock } from "../components/common";
import { serverNow } from "../clock";
import { formatAge, formatNumber } from "../format";
import { useData } from "../hooks";
import type { Location } from "../router";

export function WorkersPage(props: { location: Location }) {
  const workers = useData(() => api.workers(), "workers");
  const highlight = props.location.params.get("worker");
  const items = workers.data?.items ?? [];
  const now = workers.data?.now ?? serverNow();
  return (
    <section aria-labelledby="workers-title">
      <div class="page-head">
        <h1 id="workers-title">Workers</h1>
      </div>
      <ErrorNote error={workers.error} what="the workers" />
      {!workers.data && !workers.error && <Loading what="workers" />}
      {workers.data && !items.length && <p class="muted">No worker has contacted the store yet.</p>}
      {items.length > 0 && (
        <div class="table-wrap">
          <table aria-label="workers">
            <thead>
              <tr>
                <th scope="col">Worker</th>
                <th scope="col">Status</th>
                <th scope="col">Heartbeat</th>
                <th scope="col">Current rollout</th>
                <th scope="col">Rollouts / min</th>
                <th scope="col">Last dequeue</th>
                <th scope="col">System</th>
              </tr>
            </thead>
            <tbody>
              {items.map((w) => (
                <tr key={w.worker_id} class={w.worker_id === highlight ? "selected" : ""}>
                  <td class="mono clip" title={w.worker_id}>
                    {w.worker_id}
                  </td>
                  <td>
                    <StatusBadge status={w.status} />
                  </td>
                  <td>{formatAge(w.last_heartbeat_time, now)}</td>
                  <td class="mono">
                    {w.current_rollout_id ? <Link to={`/rollouts/${encodeURIComponent(w.current_rollout_id)}`}>{w.current_rollout_id}</Link> : "–"}
                  </td>
                  <td class="num" title={`${w.finished_recently} finished in the last ${Math.round(workers.data!.window_seconds / 60)} minutes`}>
                    {formatNumber(w.throughput_per_minute, 2)}
                  </td>
                  <td>{formatAge(w.last_dequeue_time, now)}</td>
                  <td>
                    {w.heartbeat_stats ? (
                      <details>
                        <summary>
                          cpu {formatNumber(w.heartbeat_stats.cpu_usage_pct as number, 0)}% · mem {formatNumber(w.heartbeat_stats.mem_pct as number, 0)}%
                        </summary>
                        <TextBlock value={w.heartbeat_stats} label="the system snapshot" />
                      </details>
                    ) : (
                      "–"
                    )}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </section>
  );
}
