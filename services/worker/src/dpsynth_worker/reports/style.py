"""The evaluation report's style sheet (inline in the page: the report is one self-contained
file, no external resource)."""

CSS = """
:root{--ink:#1f2328;--muted:#5b636e;--line:#e3e6ea;--soft:#f6f8fa;--blue:#3b6fb6;
--red:#b42318;--green:#1a7f37}
*{box-sizing:border-box}
body{margin:0;background:#eef1f4;color:var(--ink);
font:14px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif}
main{max-width:1120px;margin:0 auto;padding:24px}
header.top{background:#fff;border-radius:10px;padding:22px 26px;margin-bottom:18px;
box-shadow:0 1px 2px rgba(0,0,0,.06)}
h1{margin:0 0 4px;font-size:24px}h2{margin:0 0 12px;font-size:18px}
h3{margin:16px 0 8px;font-size:15px;color:var(--muted)}
.sub{color:var(--muted)}code,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,monospace;
font-size:12px}
section{background:#fff;border-radius:10px;padding:20px 26px;margin-bottom:18px;
box-shadow:0 1px 2px rgba(0,0,0,.06)}
.banner{border-radius:8px;padding:14px 18px;margin:14px 0 0;font-weight:700;font-size:16px;
letter-spacing:.02em}
.banner.nondp{background:#fdecea;color:var(--red);border:2px solid var(--red)}
.banner.nondp small{display:block;font-weight:400;font-size:13px;color:#7a1b13;
letter-spacing:0}
.banner.public{background:#eaf5ee;color:var(--green);border:1px solid #b7dfc4;
font-weight:600;font-size:14px}
.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(170px,1fr));gap:10px}
.card{background:var(--soft);border:1px solid var(--line);border-radius:8px;padding:10px 12px}
.card .k{color:var(--muted);font-size:12px}.card .v{font-size:17px;font-weight:600;
word-break:break-all}
table{border-collapse:collapse;width:100%;margin:6px 0 10px}
th,td{text-align:left;padding:6px 10px;border-bottom:1px solid var(--line);vertical-align:top}
th{background:var(--soft);font-weight:600;font-size:13px}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.headline td{font-weight:600}
.na{color:#9aa1a9;font-style:italic}
.charts{display:flex;flex-wrap:wrap;gap:24px;align-items:flex-start}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(320px,1fr));gap:14px}
.grid figure{display:inline-block;margin:0 10px 8px 0;vertical-align:top}
figure{margin:0}figcaption{font-size:12px;color:var(--muted);margin-top:4px}
img.px{image-rendering:pixelated;image-rendering:crisp-edges;border:1px solid var(--line);
border-radius:4px;background:#fff;max-width:100%}
.pairs{display:grid;grid-template-columns:repeat(auto-fill,minmax(200px,1fr));gap:12px}
.pair{border:1px solid var(--line);border-radius:8px;padding:8px;background:var(--soft)}
.pair .imgs{display:flex;gap:6px}.pair .imgs div{text-align:center;font-size:11px;
color:var(--muted)}
.pair.flag{border-color:var(--red);background:#fff5f4}
.tag{display:inline-block;border-radius:10px;padding:1px 8px;font-size:11px;font-weight:600}
.tag.ok{background:#dff3e4;color:var(--green)}.tag.bad{background:#fdecea;color:var(--red)}
.withheld{width:84px;height:84px;display:flex;align-items:center;justify-content:center;
border:1px dashed #c4c9cf;border-radius:4px;font-size:10px;color:var(--muted);text-align:center}
ul.notes li{margin:4px 0}
details pre{background:var(--soft);padding:12px;border-radius:6px;overflow:auto;font-size:12px}
footer{color:var(--muted);font-size:12px;text-align:center;padding:8px 0 24px}
"""
