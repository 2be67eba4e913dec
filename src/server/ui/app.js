// Lists the server's sessions. A placeholder for the full web UI.
"use strict";

const tokenKey = "keel-token";

function headers() {
  const token = sessionStorage.getItem(tokenKey);
  return token ? { Authorization: `Bearer ${token}` } : {};
}

async function loadSessions() {
  const status = document.getElementById("status");
  const list = document.getElementById("sessions");
  const response = await fetch("/v1/sessions?limit=100", { headers: headers() });
  if (response.status === 401) {
    status.textContent = "This server needs a token.";
    document.getElementById("token-form").hidden = false;
    return;
  }
  if (!response.ok) {
    status.textContent = `Cannot list sessions (${response.status}).`;
    return;
  }
  const body = await response.json();
  list.replaceChildren(
    ...body.sessions.map((session) => {
      const item = document.createElement("li");
      item.textContent = `${session.id} — ${session.state}, ${session.turns_completed} turns`;
      return item;
    }),
  );
  status.textContent = body.sessions.length ? "" : "No sessions yet.";
}

document.getElementById("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(tokenKey, document.getElementById("token").value);
  document.getElementById("token-form").hidden = true;
  loadSessions();
});

loadSessions();
