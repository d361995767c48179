// Line diff of two texts (longest common subsequence), for comparing resource versions.
export interface DiffLine {
  op: "same" | "add" | "remove";
  text: string;
}

const MAX_CELLS = 4_000_000;

export function diffLines(before: string, after: string): DiffLine[] {
  const a = before.split("\n");
  const b = after.split("\n");
  // Common head and tail first: most edits touch a few lines.
  let head = 0;
  while (head < a.length && head < b.length && a[head] === b[head]) head++;
  let tail = 0;
  while (tail < a.length - head && tail < b.length - head && a[a.length - 1 - tail] === b[b.length - 1 - tail]) tail++;
  const x = a.slice(head, a.length - tail);
  const y = b.slice(head, b.length - tail);
  const middle: DiffLine[] = [];
  if (x.length * y.length > MAX_CELLS) {
    x.forEach((text) => middle.push({ op: "remove", text }));
    y.forEach((text) => middle.push({ op: "add", text }));
  } else {
    const n = x.length;
    const m = y.length;
    const lcs: Uint32Array[] = Array.from({ length: n + 1 }, () => new Uint32Array(m + 1));
    for (let i = n - 1; i >= 0; i--)
      for (let j = m - 1; j >= 0; j--) lcs[i][j] = x[i] === y[j] ? lcs[i + 1][j + 1] + 1 : Math.max(lcs[i + 1][j], lcs[i][j + 1]);
    let i = 0;
    let j = 0;
    while (i < n && j < m) {
      if (x[i] === y[j]) {
        middle.push({ op: "same", text: x[i] });
        i++;
        j++;
      } else if (lcs[i + 1][j] >= lcs[i][j + 1]) middle.push({ op: "remove", text: x[i++] });
      else middle.push({ op: "add", text: y[j++] });
    }
    while (i < n) middle.push({ op: "remove", text: x[i++] });
    while (j < m) middle.push({ op: "add", text: y[j++] });
  }
  return [
    ...a.slice(0, head).map((text) => ({ op: "same" as const, text })),
    ...middle,
    ...a.slice(a.length - tail).map((text) => ({ op: "same" as const, text })),
  ];
}
