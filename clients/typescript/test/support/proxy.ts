// A small HTTP proxy between the client and a real server, to make the
// faults a network makes: it can drop a connection once the server has
// answered (the client never sees the answer), or change the answers'
// headers.

import { type IncomingMessage, type Server, type ServerResponse, createServer, request } from "node:http";
import type { AddressInfo } from "node:net";

/** Decides what happens to one request; the default forwards it as it is. */
export interface ProxyRules {
  /** Whether to drop the client's connection once the server has answered this request. */
  dropAnswer?: (request: IncomingMessage) => boolean;
  /** Changes the answer's headers before they are sent on. */
  headers?: (headers: Record<string, string | string[] | undefined>) => void;
}

/** A proxy to `upstream` (a base URL). */
export class Proxy {
  /** Requests the proxy forwarded, as `METHOD path`. */
  readonly seen: string[] = [];
  /** The `Idempotency-Key` of each request that had one, in order. */
  readonly keys: string[] = [];
  /** Answers dropped, as `METHOD path status`. */
  readonly dropped: string[] = [];
  rules: ProxyRules = {};
  private constructor(
    private readonly server: Server,
    readonly baseUrl: string,
  ) {}

  static async start(upstream: string): Promise<Proxy> {
    const target = new URL(upstream);
    let proxy: Proxy | undefined;
    const server = createServer((incoming, outgoing) => proxy?.forward(target, incoming, outgoing));
    await new Promise<void>((done) => server.listen(0, "127.0.0.1", done));
    const { port } = server.address() as AddressInfo;
    proxy = new Proxy(server, `http://127.0.0.1:${port}`);
    return proxy;
  }

  async stop(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise<void>((done) => this.server.close(() => done()));
  }

  private forward(target: URL, incoming: IncomingMessage, outgoing: ServerResponse): void {
    this.seen.push(`${incoming.method} ${incoming.url}`);
    const key = incoming.headers["idempotency-key"];
    if (typeof key === "string") {
      this.keys.push(key);
    }
    const drop = this.rules.dropAnswer?.(incoming) === true;
    const upstream = request(
      {
        host: target.hostname,
        port: target.port,
        method: incoming.method,
        path: incoming.url,
        headers: { ...incoming.headers, host: target.host },
      },
      (answer) => {
        if (drop) {
          // The server has answered and stored what it answered for; the
          // client loses the answer with its connection.
          this.dropped.push(`${incoming.method} ${incoming.url} ${answer.statusCode}`);
          answer.resume();
          incoming.socket.destroy();
          return;
        }
        const headers = { ...answer.headers };
        this.rules.headers?.(headers);
        outgoing.writeHead(answer.statusCode ?? 502, headers);
        answer.pipe(outgoing);
      },
    );
    upstream.on("error", () => incoming.socket.destroy());
    outgoing.on("close", () => upstream.destroy());
    incoming.pipe(upstream);
  }
}
