/** Numbers, durations and times as the pages show them. */

export function num(n: number | null | undefined): string {
  return Number(n || 0).toLocaleString('en-US');
}

/** A duration: "42s", "3m 5s", "2h 10m", "4d 3h". */
export function age(seconds: number): string {
  const sec = Math.max(0, Math.round(Number(seconds) || 0));
  if (sec < 60) return `${sec}s`;
  if (sec < 3600) return `${Math.floor(sec / 60)}m ${sec % 60}s`;
  if (sec < 86400) return `${Math.floor(sec / 3600)}h ${Math.floor((sec % 3600) / 60)}m`;
  return `${Math.floor(sec / 86400)}d ${Math.floor((sec % 86400) / 3600)}h`;
}

function pad(n: number): string {
  return (n < 10 ? '0' : '') + n;
}

/** Local time: the clock alone for today, with the date otherwise. */
export function time(iso: string | null | undefined): string {
  if (!iso) return '';
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return String(iso);
  const clock = `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  if (d.toDateString() === new Date().toDateString()) return clock;
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${clock}`;
}

export function ago(iso: string | null | undefined): string {
  if (!iso) return '';
  return `${age((Date.now() - new Date(iso).getTime()) / 1000)} ago`;
}

/** JSON text of a value; String() of one JSON cannot write (a cycle, a bigint). */
export function json(v: unknown, indent?: number): string {
  try {
    return JSON.stringify(v, null, indent);
  } catch {
    return String(v);
  }
}

/** The first `n` characters, with an ellipsis when there were more. */
export function clip(text: string | null | undefined, n: number): string {
  if (!text) return '';
  return text.length > n ? `${text.slice(0, n)}…` : text;
}
