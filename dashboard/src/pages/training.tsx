// Training curves from the metrics an algorithm stores each step (reward, loss, KL, entropy, accuracy), with the
// validation points marked.
import { api, type MetricsRecord } from "../api";
import { LineChart, type Series } from "../components/chart";
import { ErrorNote, KeyValues, Loading } from "../components/common";
import { formatNumber, formatTime } from "../format";
import { useData } from "../hooks";
import { navigate, withQuery, type Location } from "../router";

function series(records: MetricsRecord[], key: string, name: string, options: Partial<Series> = {}): Series {
  return {
    name,
    points: records
      .filter((r) => typeof r.values[key] === "number")
      .map((r) => ({ x: r.step, y: r.values[key] as number })),
    ...options,
  };
}

const CHARTS: Array<{ title: string; series: Array<[string, string, Partial<Series>?]> }> = [
  {
    title: "Reward",
    series: [
      ["train/reward_mean", "train reward (mean)"],
      ["val/reward_mean", "validation reward (mean)", { markers: true }],
    ],
  },
  { title: "Validation accuracy", series: [["val/accuracy", "validation accuracy", { markers: true }]] },
  { title: "Loss", series: [["update/loss", "loss"], ["update/pg_loss", "policy-gradient loss", { dashed: true }]] },
  { title: "KL to the reference", series: [["update/kl", "KL"]] },
  { title: "Entropy", series: [["update/entropy", "entropy"]] },
  { title: "Throughput", series: [["update/tokens_per_second", "tokens / s"]] },
];

export function TrainingPage(props: { location: Location }) {
  const metrics = useData(() => api.metrics(), "metrics");
  if (metrics.error?.status === 501) {
    return (
      <section aria-labelledby="training-title">
        <h1 id="training-title">Training</h1>
        <p class="muted">This store does not keep training metrics ({metrics.error.message}).</p>
      </section>
    );
  }
  const records = metrics.data?.items ?? [];
  const runs = Array.from(new Set(records.map((r) => r.run_id)));
  const lastTime = new Map<string, number>();
  records.forEach((r) => lastTime.set(r.run_id, Math.max(lastTime.get(r.run_id) ?? 0, r.time)));
  runs.sort((a, b) => (lastTime.get(b) ?? 0) - (lastTime.get(a) ?? 0));
  const run = props.location.params.get("run") ?? runs[0] ?? null;
  const mine = records.filter((r) => r.run_id === run).sort((a, b) => a.step - b.step);
  const last = mine[mine.length - 1];
  return (
    <section aria-labelledby="training-title">
      <div class="page-head">
        <h1 id="training-title">Training</h1>
        {runs.length > 0 && (
          <label>
            Run{" "}
            <select value={run ?? ""} onChange={(e) => navigate(withQuery("/training", { run: (e.target as HTMLSelectElement).value }), { replace: true })}>
              {runs.map((r) => (
                <option key={r} value={r}>
                  {r}
                </option>
              ))}
            </select>
          </label>
        )}
      </div>
      <ErrorNote error={metrics.error} what="the training metrics" />
      {!metrics.data && !metrics.error && <Loading what="training metrics" />}
      {metrics.data && !runs.length && (
        <p class="muted">No training metrics yet. Algorithms run by a Trainer (GRPO) store one record per step here.</p>
      )}
      {run && !mine.length && runs.length > 0 && <p class="error-note">No metrics for run {run}.</p>}
      {last && (
        <>
          <p class="muted">
            {mine.length} step records · last at step {last.step}, {formatTime(last.time)}
          </p>
          <div class="charts">
            {CHARTS.map((chart) => (
              <LineChart key={chart.title} title={chart.title} series={chart.series.map(([key, name, options]) => series(mine, key, name, options))} />
            ))}
          </div>
          <details>
            <summary>All metrics of step {last.step}</summary>
            <KeyValues label={`metrics of step ${last.step}`} rows={Object.entries(last.values).map(([k, v]) => [k, formatNumber(v, 4)])} />
          </details>
        </>
      )}
    </section>
  );
}
