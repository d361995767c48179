// The store's clock as the page knows it. Times in the store's answers are the server's; the browser's own clock may
// be minutes or hours off, so ages and running durations are measured against the server's time: every answer's
// `Date` header tells it (to the second), and a route that answers with its `now` tells it exactly.

/** Server time minus browser time, in seconds; null until an answer said what time it is on the server. */
let offset: number | null = null;

/** An answer's `Date` header: the server's time, cut to the second, when it answered. */
export function noteServerDate(header: string | null, receivedAt: number = Date.now() / 1000): void {
  if (!header) return;
  const seconds = Date.parse(header) / 1000;
  // The header drops the fraction of the second: its middle is the best guess.
  if (Number.isFinite(seconds)) offset = seconds + 0.5 - receivedAt;
}

/** A `now` an answer carries: the server's time, exactly, when it answered. */
export function noteServerNow(now: unknown, receivedAt: number = Date.now() / 1000): void {
  if (typeof now !== "number" || !Number.isFinite(now)) return;
  offset = now - receivedAt;
}

/** The server's time now (seconds since the epoch): the browser's clock corrected by what the store last said. */
export function serverNow(): number {
  return Date.now() / 1000 + (offset ?? 0);
}

/** A time of the browser's clock (milliseconds) as the server's clock read it then (seconds). */
export function toServerTime(browserMillis: number): number {
  return browserMillis / 1000 + (offset ?? 0);
}
