// What @ag-ui/client's HttpAgent does when the connection drops mid-run,
// with and without the `unhandledRejection` handler docs/ag-ui.md gives.
//
//   node dropped.mjs '<params JSON>'
//
// params: {handle: bool}. A local server starts an event stream and cuts
// the socket. Prints `RESULT {"caught": …, "ignored": n}` before exiting
// when the process survives; without the handler the process may die of
// the client's unhandled rejection first.

import { join } from "node:path";
import { pathToFileURL } from "node:url";
import http from "node:http";

const modules = process.env.KEEL_NODE_MODULES;
if (!modules) throw new Error("KEEL_NODE_MODULES names the node_modules with @ag-ui/client");
const { HttpAgent } = await import(pathToFileURL(join(modules, "@ag-ui/client/dist/index.mjs")).href);
const params = JSON.parse(process.argv[2]);
let ignored = 0;
if (params.handle) {
  // As docs/ag-ui.md gives it.
  process.on("unhandledRejection", (reason) => {
    if (reason instanceof TypeError && reason.message === "terminated"
        && reason.cause?.code === "UND_ERR_SOCKET") {
      ignored += 1;
      return;
    }
    throw reason;
  });
}
const server = http.createServer((request, response) => {
  response.writeHead(200, { "Content-Type": "text/event-stream" });
  response.write(`data: ${JSON.stringify({ type: "RUN_STARTED", threadId: "t", runId: "r" })}\n\n`);
  setTimeout(() => response.socket.destroy(), 100);
});
await new Promise((listening) => server.listen(0, "127.0.0.1", listening));
const agent = new HttpAgent({ url: `http://127.0.0.1:${server.address().port}/`, threadId: "t" });
agent.addMessage({ id: "m1", role: "user", content: "hi" });
let caught = null;
try {
  await agent.runAgent({});
} catch (error) {
  caught = String(error?.message ?? error);
}
// Long enough for the stray rejection to surface.
await new Promise((later) => setTimeout(later, 500));
server.close();
console.log(`RESULT ${JSON.stringify({ caught, ignored })}`);
