/**
 * A small line chart as SVG text, for the benchmark curves in docs/benchmarks-journal.md: axes with
 * ticks, one polyline per series with its points marked, a legend. No plotting dependency.
 */

export interface Series {
  name: string;
  /** [x, y]; points with a non-finite y are left out (a failed run). */
  points: readonly (readonly [number, number])[];
}

export interface ChartSpec {
  title: string;
  /** Under the title, wrapped to the width (what was run). */
  subtitle?: string;
  xLabel: string;
  yLabel: string;
  series: readonly Series[];
  /** Logarithmic x axis, ticks at the data's x values (for 1, 16, 256 or 20k, 200k, 2M). */
  logX?: boolean;
  width?: number;
  height?: number;
}

const COLORS = ['#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd', '#8c564b', '#e377c2', '#17becf'];

function esc(s: string): string {
  return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');
}

/** Compact tick label: 20000 → 20k, 2000000 → 2M, 0.25 → 0.25. */
export function compact(x: number): string {
  const abs = Math.abs(x);
  const trim = (v: number) => String(Number(v.toPrecision(3)));
  if (abs >= 1e6) return `${trim(x / 1e6)}M`;
  if (abs >= 1e4) return `${trim(x / 1e3)}k`;
  return trim(x);
}

/** About `count` round tick values from 0 (or min) to at least max. */
function niceTicks(min: number, max: number, count = 5): number[] {
  if (!(max > min)) max = min + 1;
  const raw = (max - min) / count;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw)!;
  const ticks: number[] = [];
  let v = Math.floor(min / step) * step;
  do {
    ticks.push(Number(v.toPrecision(12)));
    v += step;
  } while (ticks[ticks.length - 1]! < max);
  return ticks;
}

/** Greedy word wrap to lines of at most `width` characters. */
function wrap(text: string, width: number): string[] {
  const lines: string[] = [];
  let line = '';
  for (const word of text.split(/\s+/)) {
    if (line && line.length + 1 + word.length > width) {
      lines.push(line);
      line = word;
    } else {
      line = line ? `${line} ${word}` : word;
    }
  }
  if (line) lines.push(line);
  return lines;
}

export function lineChart(spec: ChartSpec): string {
  const W = spec.width ?? 640;
  const sub = spec.subtitle ? wrap(spec.subtitle, Math.floor(W / 6.2)) : [];
  const plotH = (spec.height ?? 380) - 96;
  const m = { left: 72, right: 24, top: 48 + sub.length * 14, bottom: 76 };
  const H = m.top + plotH + m.bottom;
  const pw = W - m.left - m.right;
  const ph = H - m.top - m.bottom;
  const series = spec.series.map((s) => ({
    ...s,
    points: s.points.filter(([x, y]) => Number.isFinite(x) && Number.isFinite(y)),
  }));
  const xs = [...new Set(series.flatMap((s) => s.points.map(([x]) => x)))].sort((a, b) => a - b);
  const ys = series.flatMap((s) => s.points.map(([, y]) => y));
  const out: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}" font-family="sans-serif" font-size="12">`,
    `<rect width="${W}" height="${H}" fill="#fff"/>`,
    `<text x="${W / 2}" y="20" text-anchor="middle" font-size="15" font-weight="bold">${esc(spec.title)}</text>`,
  ];
  sub.forEach((l, i) => {
    out.push(`<text x="${W / 2}" y="${38 + i * 14}" text-anchor="middle" font-size="11" fill="#555">${esc(l)}</text>`);
  });
  if (xs.length === 0 || ys.length === 0) {
    out.push(`<text x="${W / 2}" y="${H / 2}" text-anchor="middle" fill="#a00">no data</text>`, '</svg>');
    return `${out.join('\n')}\n`;
  }

  const logX = spec.logX === true && xs[0]! > 0;
  const fx = logX ? Math.log10 : (x: number) => x;
  const [x0, x1] = [fx(xs[0]!), fx(xs[xs.length - 1]!)];
  const xPad = x1 > x0 ? (x1 - x0) * 0.06 : 1;
  const px = (x: number) => m.left + ((fx(x) - (x0 - xPad)) / (x1 - x0 + 2 * xPad)) * pw;
  const yTicks = niceTicks(0, Math.max(...ys));
  const yMax = yTicks[yTicks.length - 1]!;
  const py = (y: number) => m.top + ph - (y / yMax) * ph;

  // Grid, axes, ticks.
  for (const t of yTicks) {
    out.push(`<line x1="${m.left}" x2="${m.left + pw}" y1="${py(t)}" y2="${py(t)}" stroke="#e4e4e4"/>`);
    out.push(`<text x="${m.left - 6}" y="${py(t) + 4}" text-anchor="end">${esc(compact(t))}</text>`);
  }
  const xTicks = logX || xs.length <= 8 ? xs : niceTicks(xs[0]!, xs[xs.length - 1]!);
  for (const t of xTicks) {
    out.push(`<line x1="${px(t)}" x2="${px(t)}" y1="${m.top + ph}" y2="${m.top + ph + 5}" stroke="#333"/>`);
    out.push(`<text x="${px(t)}" y="${m.top + ph + 18}" text-anchor="middle">${esc(compact(t))}</text>`);
  }
  out.push(`<line x1="${m.left}" x2="${m.left + pw}" y1="${m.top + ph}" y2="${m.top + ph}" stroke="#333"/>`);
  out.push(`<line x1="${m.left}" x2="${m.left}" y1="${m.top}" y2="${m.top + ph}" stroke="#333"/>`);
  out.push(
    `<text x="${m.left + pw / 2}" y="${m.top + ph + 38}" text-anchor="middle">${esc(spec.xLabel)}${logX ? ' (log scale)' : ''}</text>`,
  );
  out.push(
    `<text transform="translate(18 ${m.top + ph / 2}) rotate(-90)" text-anchor="middle">${esc(spec.yLabel)}</text>`,
  );

  // Lines and points.
  series.forEach((s, i) => {
    const color = COLORS[i % COLORS.length]!;
    const pts = [...s.points].sort((a, b) => a[0] - b[0]);
    if (pts.length > 1) {
      const d = pts.map(([x, y]) => `${px(x).toFixed(1)},${py(y).toFixed(1)}`).join(' ');
      out.push(`<polyline fill="none" stroke="${color}" stroke-width="2" points="${d}"/>`);
    }
    for (const [x, y] of pts) {
      out.push(
        `<circle cx="${px(x).toFixed(1)}" cy="${py(y).toFixed(1)}" r="3.5" fill="${color}"><title>${esc(`${s.name}: ${compact(x)} → ${compact(y)}`)}</title></circle>`,
      );
    }
  });

  // Legend: one row under the x-axis label, so it never covers a point.
  const widths = series.map((s) => s.name.length * 7 + 40);
  let lx = m.left + (pw - widths.reduce((a, b) => a + b, 0)) / 2;
  const ly = m.top + ph + 62;
  series.forEach((s, i) => {
    const color = COLORS[i % COLORS.length]!;
    out.push(`<line x1="${lx}" x2="${lx + 18}" y1="${ly - 4}" y2="${ly - 4}" stroke="${color}" stroke-width="2"/>`);
    out.push(`<circle cx="${lx + 9}" cy="${ly - 4}" r="3.5" fill="${color}"/>`);
    out.push(`<text x="${lx + 24}" y="${ly}">${esc(s.name)}</text>`);
    lx += widths[i]!;
  });
  out.push('</svg>');
  return `${out.join('\n')}\n`;
}
