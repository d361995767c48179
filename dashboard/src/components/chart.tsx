// A small SVG line chart: one or more series over training steps, with axes, a legend and point titles.
export interface Series {
  name: string;
  points: Array<{ x: number; y: number }>;
  dashed?: boolean;
  markers?: boolean;
}

const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2"];
const W = 520;
const H = 220;
const PAD = { left: 52, right: 12, top: 12, bottom: 30 };

function ticks(min: number, max: number, count = 5): number[] {
  if (min === max) return [min];
  const step = (max - min) / (count - 1);
  return Array.from({ length: count }, (_, i) => min + i * step);
}

function label(value: number): string {
  const abs = Math.abs(value);
  if (abs !== 0 && (abs < 1e-3 || abs >= 1e5)) return value.toExponential(1);
  return Number(value.toFixed(abs < 1 ? 3 : abs < 100 ? 2 : 0)).toString();
}

export function LineChart(props: { title: string; series: Series[]; xLabel?: string }) {
  const all = props.series.flatMap((s) => s.points).filter((p) => Number.isFinite(p.y) && Number.isFinite(p.x));
  const titleId = `chart-${props.title.replace(/\W+/g, "-").toLowerCase()}`;
  if (!all.length) {
    return (
      <figure class="chart" aria-labelledby={titleId}>
        <figcaption id={titleId}>{props.title}</figcaption>
        <p class="muted">No data yet.</p>
      </figure>
    );
  }
  let [xMin, xMax] = [Math.min(...all.map((p) => p.x)), Math.max(...all.map((p) => p.x))];
  let [yMin, yMax] = [Math.min(...all.map((p) => p.y)), Math.max(...all.map((p) => p.y))];
  if (xMin === xMax) [xMin, xMax] = [xMin - 1, xMax + 1];
  if (yMin === yMax) [yMin, yMax] = [yMin - Math.max(1e-3, Math.abs(yMin) * 0.1), yMax + Math.max(1e-3, Math.abs(yMax) * 0.1)];
  const sx = (x: number) => PAD.left + ((x - xMin) / (xMax - xMin)) * (W - PAD.left - PAD.right);
  const sy = (y: number) => H - PAD.bottom - ((y - yMin) / (yMax - yMin)) * (H - PAD.top - PAD.bottom);
  return (
    <figure class="chart" aria-labelledby={titleId}>
      <figcaption id={titleId}>{props.title}</figcaption>
      <svg viewBox={`0 0 ${W} ${H}`} role="img" aria-label={`${props.title} per ${props.xLabel ?? "step"}`}>
        {ticks(yMin, yMax).map((t) => (
          <g key={`y${t}`}>
            <line x1={PAD.left} x2={W - PAD.right} y1={sy(t)} y2={sy(t)} class="grid" />
            <text x={PAD.left - 6} y={sy(t) + 4} text-anchor="end" class="tick">
              {label(t)}
            </text>
          </g>
        ))}
        {ticks(xMin, xMax, Math.min(6, Math.round(xMax - xMin) + 1)).map((t) => (
          <text key={`x${t}`} x={sx(t)} y={H - PAD.bottom + 16} text-anchor="middle" class="tick">
            {label(Math.round(t))}
          </text>
        ))}
        <text x={(W + PAD.left) / 2} y={H - 2} text-anchor="middle" class="axis-label">
          {props.xLabel ?? "step"}
        </text>
        {props.series.map((s, i) => {
          const color = COLORS[i % COLORS.length];
          const points = s.points.filter((p) => Number.isFinite(p.y)).sort((a, b) => a.x - b.x);
          const path = points.map((p, j) => `${j ? "L" : "M"}${sx(p.x).toFixed(1)},${sy(p.y).toFixed(1)}`).join(" ");
          return (
            <g key={s.name}>
              {points.length > 1 && !s.markers && (
                <path d={path} fill="none" stroke={color} stroke-width="2" stroke-dasharray={s.dashed ? "5 4" : undefined} />
              )}
              {(s.markers || points.length <= 40) &&
                points.map((p) => (
                  <circle key={p.x} cx={sx(p.x)} cy={sy(p.y)} r={s.markers ? 4.5 : 2.5} fill={s.markers ? "none" : color} stroke={color} stroke-width="2">
                    <title>
                      {s.name} at step {p.x}: {label(p.y)}
                    </title>
                  </circle>
                ))}
            </g>
          );
        })}
      </svg>
      <ul class="legend">
        {props.series.map((s, i) => (
          <li key={s.name}>
            <span class="swatch" style={{ background: COLORS[i % COLORS.length] }} aria-hidden="true" />
            {s.name}
          </li>
        ))}
      </ul>
    </figure>
  );
}
