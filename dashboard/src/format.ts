// Formatting of times, durations and numbers.
import { serverNow } from "./clock";

const pad = (n: number, w = 2) => String(n).padStart(w, "0");

/** The browser's time zone at `d` as its offset from UTC ("UTC", "UTC+05:30", "UTC-04:00"): a shown time always says
 * which zone it is in, and the offset is the same in every locale. */
export function zoneOf(d: Date = new Date()): string {
  const minutes = -d.getTimezoneOffset();
  if (minutes === 0) return "UTC";
  const abs = Math.abs(minutes);
  return `UTC${minutes > 0 ? "+" : "-"}${pad(Math.floor(abs / 60))}:${pad(abs % 60)}`;
}

/** A time (seconds since the epoch) in the browser's zone, with the zone: "2025-03-01 14:05:09 UTC+05:30". */
export function formatTime(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "–";
  const d = new Date(seconds * 1000);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${formatClock(seconds)}`;
}

/** The time of day only (seconds since the epoch), with the zone: "14:05:09 UTC+05:30". */
export function formatClock(seconds: number): string {
  const d = new Date(seconds * 1000);
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())} ${zoneOf(d)}`;
}

/** A duration; never negative (clocks of different machines can disagree by a little): below zero reads "0 s". */
export function formatDuration(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "–";
  if (seconds <= 0) return "0 s";
  if (seconds < 0.001) return `${(seconds * 1e6).toFixed(0)} µs`;
  if (seconds < 1) return `${(seconds * 1000).toFixed(seconds < 0.01 ? 2 : 0)} ms`;
  if (seconds < 60) return `${seconds.toFixed(seconds < 10 ? 2 : 1)} s`;
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return `${minutes} min ${Math.floor(seconds - minutes * 60)} s`;
  const hours = Math.floor(minutes / 60);
  return `${hours} h ${minutes - hours * 60} min`;
}

/** How long ago a time of the server was, by the server's clock (`now`, by default the page's estimate of it). */
export function formatAge(seconds: number | null | undefined, now: number = serverNow()): string {
  if (seconds === null || seconds === undefined) return "never";
  const age = now - seconds;
  return age < 0.001 ? "just now" : `${formatDuration(age)} ago`;
}

const NON_FINITE = new Map<string, number>([
  ["NaN", NaN],
  ["Infinity", Infinity],
  ["-Infinity", -Infinity],
]);

/** A number as the store's JSON carries it: a number, or "NaN", "Infinity" or "-Infinity" (which JSON lacks). */
export type WireNumber = number | "NaN" | "Infinity" | "-Infinity";

/** The number a JSON value carries (NaN and the infinities included), or null when it carries none. */
export function fromWire(value: unknown): number | null {
  if (typeof value === "number") return value;
  return typeof value === "string" ? (NON_FINITE.get(value) ?? null) : null;
}

/** NaN and the infinities as the store's JSON writes them. */
function nonFinite(value: number): string {
  return Number.isNaN(value) ? "NaN" : value > 0 ? "Infinity" : "-Infinity";
}

/** A number; NaN and infinities as they are, "–" when there is none. */
export function formatNumber(wire: WireNumber | null | undefined, digits = 3): string {
  const value = fromWire(wire);
  if (value === null) return "–";
  if (!Number.isFinite(value)) return nonFinite(value);
  if (Number.isInteger(value) && Math.abs(value) < 1e9) return String(value);
  const abs = Math.abs(value);
  if (abs !== 0 && (abs < 1e-3 || abs >= 1e6)) return value.toExponential(2);
  return value.toFixed(digits);
}

/** Text of any JSON value, pretty-printed (strings as they are). */
export function toText(value: unknown): string {
  if (typeof value === "string") return value;
  if (value === undefined) return "";
  try {
    return JSON.stringify(value, null, 2);
  } catch {
    return String(value);
  }
}

/** A reward, always with three decimals (so 0 and 0.5 line up in a column); NaN and infinities as emitted. */
export function formatReward(wire: WireNumber | null | undefined): string {
  const value = fromWire(wire);
  if (value === null) return "–";
  return Number.isFinite(value) ? value.toFixed(3) : nonFinite(value);
}
