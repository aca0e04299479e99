// Open a page in Debian's headless Chromium (driven by playwright-core, which downloads no browser),
// wait for elements, and print what the page shows as JSON on stdout:
//
//   node check_page.mjs URL SCREENSHOT.png [--wait SELECTOR]... [--frame URL_PART] [--cookie NAME=VALUE] [--timeout MS]
//
// --wait      CSS selectors that must appear (default: #meta)
// --frame     look inside the iframe whose src contains URL_PART (a view embedded in the Airflow UI)
// --cookie    a cookie for URL's origin (e.g. Airflow's session token `_token=JWT`)
//
// Output: {status, url, title, state, notes, error, summary: {col: value}, tables: {id: {headers, rows}},
//          plots: {id: {kind, title, visible, series: [{label, values, x}], markers: [label]}}, frame_src,
//          requests: [every URL the page and its frames requested]}
// where each table row is {col: {text, value}} (value: the cell's data-value as a number, else null).
// Exit code 0 when every selector appeared, 1 otherwise (the JSON then has "failure").
import { chromium } from "playwright-core";

const CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
  "--disable-component-update", "--disable-sync"];

function parseArgs(argv) {
  const opts = { wait: [], frame: null, cookies: [], timeout: 30000 };
  const rest = [];
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--wait") opts.wait.push(argv[++i]);
    else if (argv[i] === "--frame") opts.frame = argv[++i];
    else if (argv[i] === "--cookie") opts.cookies.push(argv[++i]);
    else if (argv[i] === "--timeout") opts.timeout = Number(argv[++i]);
    else rest.push(argv[i]);
  }
  if (rest.length !== 2) {
    console.error("usage: node check_page.mjs URL SCREENSHOT.png [--wait SELECTOR]... [--frame URL_PART] [--cookie NAME=VALUE] [--timeout MS]");
    process.exit(2);
  }
  [opts.url, opts.screenshot] = rest;
  if (opts.wait.length === 0) opts.wait.push("#meta");
  return opts;
}

// Runs in the page: everything the report shows, as data.
function extract() {
  const num = (el) => {
    const v = el.getAttribute("data-value");
    return v === null ? null : Number(v);
  };
  const tables = {};
  for (const t of document.querySelectorAll("table.data")) {
    const headers = [...t.querySelectorAll("thead th")].map((th) => th.textContent.trim());
    const rows = [...t.querySelectorAll("tbody tr")].map((tr) => {
      const row = {};
      for (const td of tr.querySelectorAll("td")) row[td.getAttribute("data-col")] = { text: td.textContent.trim(), value: num(td) };
      return row;
    });
    tables[t.id] = { headers, rows };
  }
  const plots = {};
  for (const svg of document.querySelectorAll("svg.plot")) {
    const box = svg.getBoundingClientRect();
    plots[svg.id] = {
      kind: svg.getAttribute("data-kind"),
      title: svg.querySelector("title")?.textContent ?? "",
      visible: box.width > 0 && box.height > 0,
      series: [...svg.querySelectorAll("g.series")].map((g) => ({
        label: g.getAttribute("data-label"),
        values: [...g.querySelectorAll("[data-value]")].map(num),
        x: [...g.querySelectorAll("[data-value]")].map((el) => el.getAttribute("data-x") ?? el.getAttribute("data-category")),
      })),
      markers: [...svg.querySelectorAll("g.marker")].map((g) => g.getAttribute("data-label")),
    };
  }
  const summary = {};
  for (const c of document.querySelectorAll("#summary .card")) summary[c.getAttribute("data-col")] = num(c);
  return {
    title: document.title,
    state: document.querySelector("#meta")?.getAttribute("data-state") ?? null,
    notes: [...document.querySelectorAll("#notes li")].map((li) => li.textContent.trim()),
    error: document.querySelector("#error")?.textContent.trim() ?? null,
    empties: [...document.querySelectorAll("p.empty")].map((p) => p.id),
    summary, tables, plots,
  };
}

const opts = parseArgs(process.argv.slice(2));
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  headless: true,
  args: CHROMIUM_ARGS,
});
let out = { url: opts.url };
let code = 0;
try {
  const context = await browser.newContext({ viewport: { width: 1400, height: 1000 } });
  const origin = new URL(opts.url).origin;
  await context.addCookies(opts.cookies.map((c) => {
    const at = c.indexOf("=");
    return { name: c.slice(0, at), value: c.slice(at + 1), url: origin };
  }));
  const page = await context.newPage();
  const requests = [];
  page.on("request", (r) => requests.push(r.url()));
  out.requests = requests;
  const response = await page.goto(opts.url, { waitUntil: "load", timeout: opts.timeout });
  out.status = response ? response.status() : null;
  let target = page;
  try {
    if (opts.frame) {
      const handle = await page.waitForSelector(`iframe[src*="${opts.frame}"]`, { timeout: opts.timeout });
      out.frame_src = await handle.getAttribute("src");
      target = await handle.contentFrame();
      await target.waitForLoadState("load");
    }
    for (const sel of opts.wait) await target.waitForSelector(sel, { state: "attached", timeout: opts.timeout });
  } catch (err) {
    out.failure = String(err.message || err).split("\n")[0];
    code = 1;
  }
  Object.assign(out, await target.evaluate(extract));
  await page.screenshot({ path: opts.screenshot, fullPage: !opts.frame });
  out.screenshot = opts.screenshot;
} catch (err) {
  out.failure = String(err.message || err).split("\n")[0];
  code = 1;
} finally {
  await browser.close();
}
process.stdout.write(JSON.stringify(out) + "\n");
process.exit(code);
