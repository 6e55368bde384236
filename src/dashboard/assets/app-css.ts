/** The dashboard's stylesheet, served as /assets/app.css (no build step, no inline styles). */
export const APP_CSS = String.raw`
:root {
  --bg: #f6f7f9; --panel: #fff; --text: #1d2330; --muted: #687085; --line: #e2e5eb;
  --accent: #2c5ee8; --ok: #1f9d55; --bad: #d64545; --warn: #c27c0e; --info: #6b4fd8;
  font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--text); background: var(--bg);
}
* { box-sizing: border-box; }
body { margin: 0; }
a { color: var(--accent); text-decoration: none; }
a:hover { text-decoration: underline; }
.top { display: flex; align-items: center; gap: 18px; padding: 0 20px; height: 48px; background: #151b2c; color: #e8ebf3; }
.top .brand { font-weight: 700; font-size: 17px; letter-spacing: .5px; }
.top nav { display: flex; gap: 4px; }
.top nav a { color: #b8c0d6; padding: 6px 10px; border-radius: 6px; }
.top nav a.active, .top nav a:hover { background: #283149; color: #fff; text-decoration: none; }
.top .spacer { flex: 1; }
.top .who { color: #b8c0d6; font-size: 12px; }
.live { font-size: 11px; text-transform: uppercase; letter-spacing: .6px; color: #8fe0b0; }
.live::before { content: "● "; }
.live.paused { color: #b8c0d6; } .live.error { color: #ff9b9b; }
button.link { background: none; border: 0; color: #b8c0d6; cursor: pointer; padding: 0; }
main { padding: 16px 24px 40px; max-width: 1400px; margin: 0 auto; }
h1 { font-size: 20px; margin: 4px 0 14px; }
h2 { font-size: 15px; margin: 18px 0 8px; }
h3 { font-size: 13px; margin: 16px 0 6px; text-transform: uppercase; letter-spacing: .5px; color: var(--muted); }
.muted { color: var(--muted); } .small { font-size: 12px; }
.mono, pre { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12px; }
pre { background: var(--panel); border: 1px solid var(--line); border-radius: 6px; padding: 10px; overflow: auto; max-height: 420px; white-space: pre-wrap; word-break: break-word; }
.error-text { color: var(--bad); }
.cards { display: grid; grid-template-columns: repeat(6, minmax(0, 1fr)); gap: 12px; }
.card { background: var(--panel); border: 1px solid var(--line); border-radius: 8px; padding: 10px 14px; border-top: 3px solid var(--accent); min-width: 0; }
.card.running { border-top-color: var(--info); } .card.dead { border-top-color: var(--bad); } .card.oldest { border-top-color: var(--warn); }
.card.workers, .card.leader { border-top-color: var(--ok); }
.card-label { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .5px; }
.card-value { font-size: 24px; font-weight: 650; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.card-note { color: var(--muted); font-size: 12px; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.charts { display: grid; grid-template-columns: 1fr 1fr; gap: 12px; margin-top: 12px; }
.chart { margin: 0; background: var(--panel); border: 1px solid var(--line); border-radius: 8px; padding: 8px 12px; }
.chart figcaption { font-weight: 600; margin-bottom: 4px; }
.chart svg { width: 100%; height: auto; display: block; }
.chart .bar.ok { fill: var(--ok); } .chart .bar.bad { fill: var(--bad); }
.chart .axis { stroke: var(--line); }
.chart .label { font-size: 10px; fill: var(--muted); } .chart .label.end { text-anchor: end; } .chart .label.middle { text-anchor: middle; }
.columns { display: grid; grid-template-columns: 1fr 1fr; gap: 16px; }
table { width: 100%; border-collapse: collapse; background: var(--panel); border: 1px solid var(--line); border-radius: 8px; overflow: hidden; }
th, td { text-align: left; padding: 6px 10px; border-bottom: 1px solid var(--line); vertical-align: top; }
th { font-size: 12px; color: var(--muted); font-weight: 600; background: #fafbfc; }
tr:last-child td { border-bottom: 0; }
tr.clickable { cursor: pointer; } tr.clickable:hover td { background: #f3f6ff; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 11px; font-weight: 600; background: #e9ecf2; color: #465066; }
.badge.ready, .badge.ok, .badge.active, .badge.leader { background: #e2f5ea; color: #17693b; }
.badge.running { background: #ece7ff; color: #4b34a8; }
.badge.scheduled, .badge.retryable, .badge.waiting { background: #fff2da; color: #8a5608; }
.badge.dead, .badge.paused, .badge.stuck { background: #fde4e4; color: #a12c2c; }
.badge.completed { background: #e4edff; color: #2449b0; }
.badge.ro { background: #ffd9a8; color: #6b3d00; text-transform: uppercase; letter-spacing: .5px; }
.filters { display: flex; flex-wrap: wrap; gap: 10px; align-items: center; margin-bottom: 12px; }
.filters label { color: var(--muted); font-size: 12px; }
input, select, button { font: inherit; }
input, select { padding: 4px 8px; border: 1px solid #cdd2dc; border-radius: 6px; background: #fff; }
button { padding: 4px 12px; border: 1px solid #cdd2dc; border-radius: 6px; background: #fff; cursor: pointer; }
button:hover:not(:disabled) { border-color: var(--accent); color: var(--accent); }
button:disabled { opacity: .45; cursor: default; }
button.danger { color: var(--bad); border-color: #f0c4c4; }
.actions { display: flex; flex-wrap: wrap; gap: 8px; align-items: center; margin-bottom: 12px; }
.row-actions { display: inline-flex; gap: 6px; align-items: center; }
.pager { display: flex; gap: 8px; align-items: center; justify-content: flex-end; margin-top: 10px; }
.pager .muted { margin-right: auto; }
.reset { font-size: 12px; }
dl.fields { display: grid; grid-template-columns: 130px 1fr; gap: 4px 12px; background: var(--panel); border: 1px solid var(--line); border-radius: 8px; padding: 10px 14px; margin: 0; }
dl.fields dt { color: var(--muted); } dl.fields dd { margin: 0; }
ol.timeline { background: var(--panel); border: 1px solid var(--line); border-radius: 8px; padding: 10px 10px 10px 34px; margin: 0; }
ol.timeline li { padding: 2px 0; } ol.timeline .when { color: var(--muted); font-size: 12px; }
#toast { position: fixed; right: 20px; bottom: 20px; max-width: 480px; padding: 10px 14px; border-radius: 8px; background: #151b2c; color: #fff; opacity: 0; transform: translateY(10px); transition: all .2s; pointer-events: none; }
#toast.show { opacity: 1; transform: none; } #toast.error { background: var(--bad); }
dialog { border: 1px solid var(--line); border-radius: 10px; padding: 18px 20px; max-width: 460px; }
dialog::backdrop { background: rgba(20, 26, 40, .45); }
dialog menu { display: flex; justify-content: flex-end; gap: 8px; padding: 0; margin: 14px 0 0; }
body.login { display: grid; place-items: center; min-height: 100vh; }
.login-box { background: var(--panel); border: 1px solid var(--line); border-radius: 10px; padding: 24px 28px; display: grid; gap: 12px; min-width: 320px; }
.login-box h1 { margin: 0; }
.login-box .error { color: var(--bad); margin: 0; }
.login-box label { display: grid; gap: 4px; color: var(--muted); }
@media (max-width: 1000px) { .cards { grid-template-columns: repeat(3, 1fr); } .charts, .columns { grid-template-columns: 1fr; } }
`;
