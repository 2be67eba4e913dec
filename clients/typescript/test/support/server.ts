// A real `keel serve` for the tests: its own temporary directory (database,
// workspaces, scripts, token file) and a loopback port; it can be killed
// (SIGKILL) and started again on the same database and port.

import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { createInterface } from "node:readline";

/** The `keel` binary under test: `KEEL_BIN`, or the workspace's debug build. */
export function keelBinary(): string {
  const bin = process.env.KEEL_BIN;
  if (bin !== undefined && bin !== "") {
    return bin;
  }
  return resolve(import.meta.dirname, "../../../../../target/debug/keel");
}

/** How long a server gets to say it listens. */
const START_TIMEOUT_MS = 30_000;

/** A `keel serve` process and its files. */
export class KeelServer {
  /** `http://127.0.0.1:PORT`, fixed across restarts. */
  baseUrl = "";
  readonly token = randomBytes(16).toString("hex");
  private child: ChildProcess | undefined;
  private port = 0;
  private stderr: string[] = [];

  private constructor(readonly dir: string) {}

  /** Starts a server in a fresh temporary directory, with `hello.jsonl`-like answers as the default model. */
  static async start(): Promise<KeelServer> {
    const dir = await mkdtemp(join(tmpdir(), "keel-ts-"));
    const server = new KeelServer(dir);
    await mkdir(server.workspaces);
    await mkdir(server.scripts);
    await writeFile(join(dir, "token"), `${server.token}\n`);
    await server.script("default.jsonl", [{ text: "Hello from the default script." }]);
    await server.launch();
    return server;
  }

  /** The directory of the sessions' workspaces. */
  get workspaces(): string {
    return join(this.dir, "workspaces");
  }

  /** The script directory (`--script-dir`). */
  get scripts(): string {
    return join(this.dir, "scripts");
  }

  /** Writes script `name` (one answer per line) and returns its model spec, `script:NAME`. */
  async script(name: string, lines: unknown[]): Promise<string> {
    await writeFile(join(this.scripts, name), lines.map((line) => JSON.stringify(line)).join("\n") + "\n");
    return `script:${name}`;
  }

  /** What the server wrote on stderr, for failure messages. */
  get log(): string {
    return this.stderr.join("\n");
  }

  /** Kills the server with SIGKILL (a crash) and waits until it is gone. */
  async kill(): Promise<void> {
    await this.signal("SIGKILL");
  }

  /** Stops the server the graceful way (SIGTERM: it ends its streams) and waits until it is gone. */
  async terminate(): Promise<void> {
    await this.signal("SIGTERM");
  }

  /** Starts the server again on the same database and port. */
  async restart(): Promise<void> {
    await this.launch();
  }

  /** Stops the server (SIGTERM) and removes its directory. */
  async stop(): Promise<void> {
    await this.terminate();
    await rm(this.dir, { recursive: true, force: true });
  }

  private async signal(signal: NodeJS.Signals): Promise<void> {
    const child = this.child;
    if (child === undefined || child.exitCode !== null || child.signalCode !== null) {
      return;
    }
    const exited = new Promise<void>((done) => child.once("exit", () => done()));
    child.kill(signal);
    await exited;
    this.child = undefined;
  }

  private async launch(): Promise<void> {
    const args = [
      "serve",
      "--create",
      "--db",
      join(this.dir, "keel.sqlite3"),
      "--listen",
      `127.0.0.1:${this.port}`,
      "--token-file",
      join(this.dir, "token"),
      "--workspace-root",
      this.workspaces,
      "--script-dir",
      this.scripts,
      "--model",
      `script:${join(this.scripts, "default.jsonl")}`,
      "--store-reserve-mb",
      "0",
      "--shutdown-grace-secs",
      "1",
    ];
    const env: NodeJS.ProcessEnv = { ...process.env, KEEL_LOG: "warn" };
    delete env.KEEL_MODEL;
    delete env.KEEL_CONFIG;
    delete env.KEEL_DB;
    const child = spawn(keelBinary(), args, { cwd: this.dir, env, stdio: ["ignore", "ignore", "pipe"] });
    this.child = child;
    const lines = createInterface({ input: child.stderr! });
    const listening = new Promise<string>((done, fail) => {
      const timer = setTimeout(() => fail(new Error(`keel serve did not start:\n${this.log}`)), START_TIMEOUT_MS);
      child.once("error", (error) => {
        clearTimeout(timer);
        fail(error);
      });
      child.once("exit", (code, signal) => {
        clearTimeout(timer);
        fail(new Error(`keel serve exited (${code ?? signal}) before listening:\n${this.log}`));
      });
      lines.on("line", (line) => {
        this.stderr.push(line);
        const address = /^keel serve listening on (http:\/\/\S+)$/.exec(line)?.[1];
        if (address !== undefined) {
          clearTimeout(timer);
          done(address);
        }
      });
    });
    this.baseUrl = await listening;
    this.port = Number(new URL(this.baseUrl).port);
  }
}
