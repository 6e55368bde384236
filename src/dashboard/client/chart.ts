import { h, s } from './dom.js';
import { num, time } from './format.js';
import type { MinutePoint } from '../wire.js';

/** A chart of inline SVG bars, one per minute, oldest on the left. */
export function barChart(
  title: string,
  points: readonly MinutePoint[],
  key: 'completed' | 'failed',
  cls: string,
): HTMLElement {
  const W = 600;
  const H = 150;
  const PAD = 28;
  const TOP = 10;
  let max = 0;
  for (const p of points) max = Math.max(max, p[key]);
  // Room on the left for the y-axis label (10px text: about 6px a character), "1,000,000" included.
  const LEFT = Math.max(PAD, 8 + num(max).length * 6);
  const scale = max > 0 ? (H - PAD - TOP) / max : 0;
  const bw = (W - LEFT) / Math.max(points.length, 1);
  const total = points.reduce((n, p) => n + p[key], 0);
  const bars = points.map((p, i) => {
    if (!(p[key] > 0)) return null;
    const bh = Math.max(1, p[key] * scale);
    return s(
      'rect',
      {
        x: (LEFT + i * bw + 1).toFixed(1),
        y: (H - PAD - bh).toFixed(1),
        width: Math.max(bw - 2, 1).toFixed(1),
        height: bh.toFixed(1),
        class: `bar ${cls}`,
      },
      s('title', {}, `${time(p.minute)}: ${num(p[key])}`),
    );
  });
  const axis = [
    s('line', { x1: LEFT, y1: H - PAD, x2: W, y2: H - PAD, class: 'axis' }),
    s('text', { x: LEFT - 4, y: TOP + 8, class: 'label end' }, num(max)),
    s('text', { x: LEFT - 4, y: H - PAD, class: 'label end' }, '0'),
    s('text', { x: LEFT, y: H - 8, class: 'label' }, `-${points.length} min`),
    s('text', { x: LEFT + (W - LEFT) / 2, y: H - 8, class: 'label middle' }, `-${Math.round(points.length / 2)} min`),
    s('text', { x: W, y: H - 8, class: 'label end' }, 'now'),
  ];
  return h('figure', { class: 'chart' }, [
    h('figcaption', {}, [title, ' ', h('span', { class: 'muted' }, `(${num(total)} in the last hour)`)]),
    s('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': title }, [axis, bars]),
  ]);
}
