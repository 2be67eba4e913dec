"""A webhook receiver for Keel's tests, verifying every delivery with the
Standard Webhooks reference library (`standardwebhooks`), not with Keel's
own code.

Usage: receiver.py PORT_FILE LOG_FILE SECRETS KEEL_URL FAIL_PERCENT

SECRETS is a secret (`whsec_...`) or a file of them, one per line, read
at every request (a test rotating the endpoint's secret adds the new one).
KEEL_URL is a URL, or a file holding one, read at every request (a test
whose server starts after the receiver writes it then).
Listens on 127.0.0.1 (a free port, written to PORT_FILE) and appends one
JSON line per request to LOG_FILE: the webhook-id, whether the signature
verified with the first secret (`ok`) and with each (`verified`), the
body, and what was answered. An `approval_requested`
delivery is approved through Keel's API (KEEL_URL) before it is
acknowledged: if Keel cannot be reached (it is down), the delivery is
answered 503 so that Keel delivers it again. FAIL_PERCENT of the verified
deliveries are answered 500 at random before anything is done, so that
redeliveries happen.
"""

import json
import os
import random
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook

PORT_FILE, LOG_FILE, SECRETS, KEEL_URL, FAIL_PERCENT = sys.argv[1:6]
LOCK = threading.Lock()


def secrets():
    if SECRETS.startswith("whsec_"):
        return [SECRETS]
    with open(SECRETS, encoding="utf-8") as lines:
        return [line.strip() for line in lines if line.strip()]


def verifies(secret, body, headers):
    try:
        Webhook(secret).verify(body, headers)
        return True
    except Exception:  # the library's own error types
        return False


def log(entry):
    with LOCK, open(LOG_FILE, "a", encoding="utf-8") as out:
        out.write(json.dumps(entry) + "\n")


def keel_url():
    if KEEL_URL.startswith("http"):
        return KEEL_URL
    with open(KEEL_URL, encoding="utf-8") as url:
        return url.read().strip()


def approve(session_id, call_id):
    """Approves a call; the HTTP status, or None when Keel is unreachable."""
    body = json.dumps({"op": {"type": "approval", "call_id": call_id, "decision": "approve"}}).encode()
    request = urllib.request.Request(
        f"{keel_url()}/v1/sessions/{session_id}/submissions",
        data=body,
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except (urllib.error.URLError, OSError):
        return None


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def answer(self, status):
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        headers = {name.lower(): value for name, value in self.headers.items()}
        entry = {"id": headers.get("webhook-id"), "body": body.decode("utf-8", "replace")}
        entry["verified"] = [verifies(secret, body, headers) for secret in secrets()]
        entry["ok"] = entry["verified"][0]
        if not entry["ok"]:
            entry["status"] = 400
            log(entry)
            self.answer(400)
            return
        if random.randrange(100) < int(FAIL_PERCENT):
            entry["status"] = 500
            log(entry)
            self.answer(500)
            return
        payload = json.loads(body)
        if payload["type"] == "approval_requested":
            event = payload["data"]["event"]
            approved = approve(payload["data"]["session_id"], event["msg"]["call_id"])
            entry["approved"] = approved
            if approved is None or approved >= 500:
                entry["status"] = 503
                log(entry)
                self.answer(503)
                return
        entry["status"] = 204
        log(entry)
        self.answer(204)


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    with open(PORT_FILE + ".tmp", "w", encoding="utf-8") as out:
        out.write(str(server.server_address[1]))


    os.rename(PORT_FILE + ".tmp", PORT_FILE)
    server.serve_forever()


if __name__ == "__main__":
    main()
