// Shared by the browser scenarios of tests/suite/web_ui.rs: launches the
// system Chromium through playwright-core (never a downloaded browser),
// runs one scenario against a running `keel serve`, and reports.
//
// A scenario script is run as
//
//   node tests/web/SCENARIO.mjs BASE_URL [PARAMS_JSON]
//
// with, in the environment, KEEL_CHROMIUM (the browser binary; default:
// `chromium` on PATH), KEEL_WEB_NODE_MODULES (where playwright-core is;
// default: .ci/node/node_modules) and optionally KEEL_WEB_ARTIFACTS (a
// directory for a screenshot and the page's HTML when a scenario fails).
// With KEEL_WEB_UI_DIR set, every page gets its files (/ and /assets/*)
// from that directory instead of the server: the same scenario checks
// another version of the UI (an older one, to see a check fail there).
// It exits 0 when every assertion held and prints `RESULT {json}` as its
// last line for the Rust side to check against the server's log.

import assert from "node:assert/strict";
import { accessSync, constants, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { delimiter, dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

export { assert };

const here = dirname(fileURLToPath(import.meta.url));

function nodeModules() {
  return resolve(process.env.KEEL_WEB_NODE_MODULES ?? join(here, "../../.ci/node/node_modules"));
}

function chromiumPath() {
  const given = process.env.KEEL_CHROMIUM;
  if (given) {
    return given;
  }
  for (const dir of (process.env.PATH ?? "").split(delimiter)) {
    const candidate = join(dir, "chromium");
    try {
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch {
      // Not here.
    }
  }
  throw new Error("no chromium on PATH: install Debian's chromium (`apt-get install -y chromium`) or set KEEL_CHROMIUM");
}

function loadPlaywright() {
  const require = createRequire(join(nodeModules(), "keel-web-tests.cjs"));
  try {
    return require("playwright-core");
  } catch (error) {
    throw new Error(
      `playwright-core is not installed in ${nodeModules()}: run \`npm ci --prefix .ci/node\` (${error.message})`,
    );
  }
}

const UI_TYPES = { js: "text/javascript", mjs: "text/javascript", css: "text/css", svg: "image/svg+xml", html: "text/html" };

/** Serves the UI files of `dir` to `page` instead of the server's. */
export async function serveUiFrom(page, dir) {
  await page.route(
    (url) => url.pathname === "/" || url.pathname.startsWith("/assets/"),
    (route) => {
      const { pathname } = new URL(route.request().url());
      const file = pathname === "/" ? "index.html" : pathname.slice("/assets/".length);
      const type = UI_TYPES[file.split(".").pop()] ?? "application/octet-stream";
      route.fulfill({ status: 200, contentType: type, body: readFileSync(join(dir, file)) });
    },
  );
}

/** Waits until `check()` is truthy (it may be async), polling. */
export async function until(what, check, { timeout = 20000, every = 25 } = {}) {
  const deadline = Date.now() + timeout;
  for (;;) {
    const value = await check();
    if (value) {
      return value;
    }
    if (Date.now() > deadline) {
      throw new Error(`timed out after ${timeout} ms waiting for ${what}`);
    }
    await new Promise((done) => setTimeout(done, every));
  }
}

/** The API path of a session. */
export function sessionPath(sessionId) {
  return `/v1/sessions/${encodeURIComponent(sessionId)}`;
}

/** The session id in the page's URL (`#/sessions/{id}`). */
export function sessionIdOf(page) {
  const match = /#\/sessions\/(.+)$/.exec(page.url());
  assert.ok(match, `no session in the URL ${page.url()}`);
  return decodeURIComponent(match[1]);
}

/** The sequences listed in the timeline, in the order shown. */
export async function timelineSequences(page) {
  return page
    .getByTestId("timeline-event")
    .evaluateAll((items) => items.map((item) => Number(item.dataset.sequence)));
}

/**
 * What the page shows at one instant: the timeline's entries and the text
 * of each assistant message, with its state.
 */
export async function snapshot(page) {
  return page.evaluate(() => {
    // The streamed text is rendered at most once a frame: render it now, so
    // the timeline and the text are read at one instant.
    document.querySelector("[data-testid=messages]").dispatchEvent(new Event("keel-render"));
    return {
    timeline: Array.from(document.querySelectorAll("[data-testid=timeline-event]"), (item) => ({
      sequence: Number(item.dataset.sequence),
      kind: item.dataset.kind,
    })),
    answers: Array.from(document.querySelectorAll("[data-testid=assistant-message]"), (item) => ({
      turn_id: item.dataset.turnId,
      state: item.dataset.state,
      text: item.querySelector("[data-testid=assistant-text]").textContent,
    })),
    };
  });
}

/** The id of the session the chat view shows, or null. */
export async function openSessionId(page) {
  return page.getByTestId("chat-view").getAttribute("data-session-id");
}

/** Waits until the chat view shows session `id`. */
export async function waitForSession(page, id) {
  await until(`the chat view of ${id}`, async () => !(await page.getByTestId("chat-view").isHidden()) && (await openSessionId(page)) === id);
}

/** The whole log of a session, fetched from inside the page. */
export async function serverLog(page, sessionId) {
  const events = [];
  for (;;) {
    const after = events.at(-1)?.sequence ?? 0;
    const reply = await pageApi(page, `${sessionPath(sessionId)}/events?after=${after}&limit=1000`);
    assert.equal(reply.status, 200, JSON.stringify(reply.body));
    events.push(...reply.body.events);
    if (!reply.body.has_more) {
      return events;
    }
  }
}

/** Asserts that `sequences` is exactly 1, 2, …, last. */
export function assertGapless(sequences, last) {
  const expected = Array.from({ length: last }, (_, index) => index + 1);
  assert.deepEqual(sequences, expected, `the timeline lists every sequence 1..${last} once, in order`);
}

/** Opens the "New chat" dialog (the drawer first at phone width). */
export async function openNewChat(page) {
  const button = page.getByTestId("new-chat");
  // The button shows once the page knows its principal's scopes (GET
  // /v1/whoami); before that it is hidden at any width.
  await page.locator("body:not(.scopes-pending)").waitFor({ state: "attached" });
  if (!(await button.isVisible())) {
    await page.getByTestId("sessions-toggle").click();
  }
  await button.click();
  await page.getByTestId("new-chat-dialog").waitFor({ state: "visible" });
}

/** Creates a session with the page's "New chat" dialog; answers its id. */
export async function createSession(page, { model, bot, instructions } = {}) {
  const before = page.url();
  await openNewChat(page);
  if (model) {
    await page.getByTestId("new-session-model").fill(model);
  }
  if (bot || instructions) {
    await page.getByTestId("new-session-more").locator("summary").click();
  }
  if (bot) {
    await page.getByTestId("new-session-bot").fill(bot);
  }
  if (instructions) {
    await page.getByTestId("new-session-instructions").fill(instructions);
  }
  await page.getByTestId("new-session-submit").click();
  await until("the URL to name the new session", () => page.url() !== before && /#\/sessions\//.test(page.url()));
  const id = sessionIdOf(page);
  await waitForSession(page, id);
  await page.locator('[data-testid=stream-status][data-state="live"]').waitFor();
  return id;
}

/** Types a message and sends it with Enter. */
export async function send(page, text, { policy } = {}) {
  if (policy) {
    await page.getByTestId("busy-policy").selectOption(policy);
  }
  const box = page.getByTestId("message-input");
  await box.fill(text);
  await box.press("Enter");
  await until("the message box to be cleared after sending", async () => (await box.inputValue()) === "");
}

/** Calls the API from inside the page (with the page's token, if any). */
export async function pageApi(page, path) {
  return page.evaluate(async (path) => {
    const token = sessionStorage.getItem("keel.token");
    const response = await fetch(path, { headers: token ? { Authorization: `Bearer ${token}` } : {} });
    return { status: response.status, body: await response.json() };
  }, path);
}

/**
 * Runs `body({ browser, context, page, base, params, log })` in a fresh
 * browser (its context made with the `context` options of playwright's
 * `browser.newContext`, over a 1200×800 viewport), prints `RESULT {json}`
 * with what it returns, and exits 0; on any failure prints the error (and
 * what the page logged) and exits 1.
 */
export async function scenario(name, body, { timeoutMs = 90000, context: contextOptions = {} } = {}) {
  const base = process.argv[2];
  const params = process.argv[3] ? JSON.parse(process.argv[3]) : {};
  const started = Date.now();
  const log = (...parts) => console.log(`[${name} +${Date.now() - started} ms]`, ...parts);
  const watchdog = setTimeout(() => {
    console.error(`${name}: timed out after ${timeoutMs} ms`);
    process.exit(1);
  }, timeoutMs);
  let browser;
  let page;
  const pageErrors = [];
  try {
    assert.ok(base, "usage: node SCENARIO.mjs BASE_URL [PARAMS_JSON]");
    const { chromium } = loadPlaywright();
    browser = await chromium.launch({ executablePath: chromiumPath(), headless: true });
    const newPage = async (context) => {
      const opened = await context.newPage();
      opened.setDefaultTimeout(20000);
      if (process.env.KEEL_WEB_UI_DIR) {
        await serveUiFrom(opened, process.env.KEEL_WEB_UI_DIR);
      }
      opened.on("pageerror", (error) => {
        pageErrors.push(error);
        log("page error:", error.message);
      });
      opened.on("console", (message) => {
        if (message.type() === "error" || message.type() === "warning") {
          log(`console ${message.type()}:`, message.text());
        }
      });
      return opened;
    };
    const context = await browser.newContext({ viewport: { width: 1200, height: 800 }, ...contextOptions });
    page = await newPage(context);
    const result = await body({ browser, context, page, base, params, log, newPage });
    assert.deepEqual(
      pageErrors.map((error) => error.message),
      [],
      "the page threw no uncaught errors",
    );
    log("passed");
    console.log(`RESULT ${JSON.stringify(result ?? {})}`);
    clearTimeout(watchdog);
    await browser.close();
    process.exit(0);
  } catch (error) {
    console.error(`${name} FAILED after ${Date.now() - started} ms:`, error?.stack ?? error);
    const artifacts = process.env.KEEL_WEB_ARTIFACTS;
    if (artifacts && page) {
      try {
        mkdirSync(artifacts, { recursive: true });
        const shot = join(artifacts, `${name}.png`);
        await page.screenshot({ path: shot, fullPage: true });
        writeFileSync(join(artifacts, `${name}.html`), await page.content());
        console.error(`the page at the failure: ${shot} and ${name}.html beside it`);
      } catch (artifactError) {
        console.error("no screenshot:", artifactError.message);
      }
    }
    await browser?.close().catch(() => {});
    process.exit(1);
  }
}

/**
 * Asserts that nothing on the page overflows sideways: neither the page
 * nor anything shown in the conversation (which scrolls on its own).
 */
export async function assertFits(page, where) {
  const { scrollWidth, innerWidth, sticking } = await page.evaluate(() => {
    const list = document.querySelector("[data-testid=messages]");
    const bounds = list.getBoundingClientRect();
    const sticking = Array.from(list.children)
      .filter((item) => item.getClientRects().length > 0)
      .map((item) => ({ item, box: item.getBoundingClientRect() }))
      .filter(({ box }) => box.left < bounds.left - 0.5 || box.right > bounds.right + 0.5 || box.right > window.innerWidth)
      .map(({ item, box }) => `${item.dataset.testid} ${Math.round(box.left)}..${Math.round(box.right)}`);
    return { scrollWidth: document.documentElement.scrollWidth, innerWidth: window.innerWidth, sticking };
  });
  assert.ok(scrollWidth <= innerWidth, `${where}: nothing overflows sideways (${scrollWidth} > ${innerWidth})`);
  assert.deepEqual(sticking, [], `${where}: every message fits the conversation`);
}

/** Asserts that `locator` is visible and wholly inside the viewport. */
export async function assertOnScreen(page, locator, what) {
  await locator.waitFor({ state: "visible" });
  const viewport = page.viewportSize();
  const inside = (box) => box && box.x >= 0 && box.y >= 0 && box.x + box.width <= viewport.width + 0.5;
  // The list re-renders its entries as the server's answers arrive: the
  // element measured may be replaced in between, so measure until stable.
  let box = null;
  try {
    await until(`${what} to be measured`, async () => inside((box = await locator.boundingBox())), { timeout: 3000 });
  } catch {
    // Reported below with the last measure.
  }
  assert.ok(inside(box), `${what} is on screen: ${JSON.stringify(box)} in ${JSON.stringify(viewport)}`);
}

/**
 * The conversation as shown: the visible user messages and answers (an
 * answer replaced by a regenerated one is hidden), and the hidden ones.
 */
export async function conversation(page) {
  return page.evaluate(() => {
    const text = (item, testId) => item.querySelector(`[data-testid=${testId}]`)?.textContent ?? "";
    const shown = (item) => !item.hidden && item.dataset.replaced !== "true";
    const users = Array.from(document.querySelectorAll("[data-testid=user-message]"));
    const answers = Array.from(document.querySelectorAll("[data-testid=assistant-message]"));
    return {
      users: users.filter(shown).map((item) => text(item, "message-text")),
      answers: answers.filter(shown).map((item) => ({ state: item.dataset.state, text: text(item, "assistant-text") })),
      replacedUsers: users.filter((item) => !shown(item)).map((item) => text(item, "message-text")),
      replacedAnswers: answers.filter((item) => !shown(item)).map((item) => text(item, "assistant-text")),
    };
  });
}

/** Waits until the last shown answer is final with `text`. */
export async function waitForAnswer(page, text) {
  await until(`the answer ${JSON.stringify(text)}`, async () => {
    const { answers } = await conversation(page);
    const last = answers.at(-1);
    return last?.state === "final" && last.text === text;
  });
}

/** Sends each of `questions` in turn and waits for the answer of the same index. */
export async function exchange(page, questions, answers) {
  for (const [index, question] of questions.entries()) {
    await send(page, question);
    await waitForAnswer(page, answers[index]);
  }
}

/**
 * Waits until the page leaves `parentId` for a fork and shows it with its
 * fork marker; returns the fork's id and the marker.
 */
export async function openedFork(page, parentId, what = "the page to switch to the fork") {
  await until(what, () => sessionIdOf(page) !== parentId);
  const forkId = sessionIdOf(page);
  await waitForSession(page, forkId);
  const marker = page.getByTestId("fork-marker");
  await marker.waitFor();
  return { forkId, marker };
}

/**
 * The button `name` of the session's menu in the chat header, with the
 * menu opened (by `how`: "click", or "tap" on a touch screen).
 */
export async function menuAction(page, name, how = "click") {
  const menu = page.getByTestId("session-menu");
  if (!(await menu.evaluate((element) => element.open))) {
    await page.getByTestId("session-menu-button")[how]();
  }
  const button = menu.getByRole("button", { name });
  await button.waitFor({ state: "visible" });
  return button;
}

/** The inherited conversation a fork shows above its divider: `{role, text}` each. */
export async function inheritedConversation(page) {
  return page
    .getByTestId("inherited-message")
    .evaluateAll((items) => items.map((item) => ({ role: item.dataset.role, text: item.textContent.trim() })));
}

/** Waits until a fork's divider has loaded what the fork inherited; answers it. */
export async function waitForInherited(page) {
  await page.locator('[data-testid=fork-marker]:not([data-inherited="loading"])[data-inherited]').waitFor({ state: "attached" });
  return inheritedConversation(page);
}
