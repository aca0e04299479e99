// Trigger a DAG from Airflow's own UI as a person would, in Debian's headless Chromium (playwright-core):
// sign in on the login page, open the DAG, press Trigger, read the form, pick values, submit.
//
//   node trigger_form.mjs BASE_URL DAG_ID USER PASSWORD SHOTS_DIR [--pick PARAM=VALUE]... [--number PARAM=N]
//
// --pick    choose VALUE in the multi-select of the array parameter PARAM (repeatable)
// --number  type N into the number field of PARAM
//
// Screenshots: SHOTS_DIR/trigger-form.png (the form as opened), trigger-form-<PARAM>-choices.png (a
// multi-select's open list), trigger-form-filled.png (before submitting).
// Output (stdout, JSON): {fields: [label], choices: {PARAM: [option]}, picked: {PARAM: [value]},
//                         request: {conf, ...} (the POST the form sent), response: {status, body}, failure}
// Exit code 0 when the run was created (HTTP 200), 1 otherwise.
import { chromium } from "playwright-core";

const CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
  "--disable-component-update", "--disable-sync"];
const TIMEOUT = 60000;
// The open list of a multi-select (react-select; Airflow's other selects use role=option too, hidden).
const REACT_OPTION = "[id^='react-select-'][id*='-option-']";

const argv = process.argv.slice(2);
const [base, dagId, user, password, shots] = argv;
const picks = [];
const numbers = [];
for (let i = 5; i < argv.length; i++) {
  const [param, value] = argv[i + 1].split(/=(.*)/s);
  if (argv[i] === "--pick") picks.push([param, value]);
  else if (argv[i] === "--number") numbers.push([param, value]);
  else throw new Error(`unknown option ${argv[i]}`);
  i++;
}

const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || "/usr/bin/chromium", headless: true,
  args: CHROMIUM_ARGS });
const out = { fields: [], choices: {}, picked: {} };
let code = 0;
let page;
try {
  page = await (await browser.newContext({ viewport: { width: 1400, height: 1100 } })).newPage();
  page.setDefaultTimeout(TIMEOUT);
  // Signing in: the UI sends a person without a session to the auth manager's login page.
  await page.goto(`${base}/dags/${dagId}`, { waitUntil: "load" });
  await page.waitForURL((u) => u.pathname.startsWith("/auth/login"));
  await page.locator("input[name=username]").fill(user);
  await page.locator("input[name=password]").fill(password);
  await page.locator("button[type=submit]").click();
  await page.waitForURL((u) => !u.pathname.startsWith("/auth"));
  if (!new URL(page.url()).pathname.startsWith(`/dags/${dagId}`)) await page.goto(`${base}/dags/${dagId}`);

  await page.getByTestId("trigger-dag-button").click();
  const dialog = page.getByRole("dialog");
  await dialog.getByText("Run Parameters").waitFor();
  await dialog.locator("[id^=element_]").first().waitFor();
  out.fields = await dialog.locator("label.chakra-field__label").evaluateAll(
    (labels) => labels.map((l) => l.textContent.replace("*", "").trim()));
  await page.screenshot({ path: `${shots}/trigger-form.png` });

  // Every multi-select the form drew for an array parameter: its offered choices.
  const selects = await dialog.locator("[id^=element_]").evaluateAll(
    (els) => els.filter((e) => e.querySelector("input[role=combobox]")).map((e) => e.id.slice("element_".length)));
  for (const param of selects) {
    const control = dialog.locator(`#element_${param} input[role=combobox]`);
    await control.click();
    const options = page.locator(REACT_OPTION);
    await options.first().waitFor();
    out.choices[param] = await options.allInnerTexts();
    await page.screenshot({ path: `${shots}/trigger-form-${param}-choices.png` });
    await control.blur();  // closes the list (Tab would pick the highlighted choice, Escape close the dialog)
  }
  for (const [param, value] of picks) {
    const control = dialog.locator(`#element_${param} input[role=combobox]`);
    await control.click();
    await page.locator(REACT_OPTION, { hasText: new RegExp(`^${value}$`) }).click();
    await control.blur();
    (out.picked[param] ??= []).push(value);
  }
  for (const [param, value] of numbers) {
    const field = dialog.locator(`#number-input\\:element_${param}\\:inc`).locator("xpath=../..").locator("input");
    await field.fill(value);
    await field.press("Tab");
  }
  await page.screenshot({ path: `${shots}/trigger-form-filled.png` });

  const posted = page.waitForResponse((r) => r.request().method() === "POST" && r.url().includes(`/dags/${dagId}/dagRuns`));
  await dialog.getByTestId("trigger-dag-submit").click();
  const response = await posted;
  out.request = JSON.parse(response.request().postData() || "{}");
  out.response = { status: response.status(), body: await response.json().catch(() => null) };
  if (response.status() !== 200) code = 1;
} catch (err) {
  out.failure = String(err.message || err).split("\n")[0];
  code = 1;
  if (page) await page.screenshot({ path: `${shots}/trigger-form-failure.png` }).catch(() => {});
} finally {
  await browser.close();
}
process.stdout.write(JSON.stringify(out) + "\n");
process.exit(code);
