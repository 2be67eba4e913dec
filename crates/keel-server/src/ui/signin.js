// The sign-in box: a dialog asking for an API key, a JWT or the server's
// token when the API answers 401 (api.js decides when, and what it says:
// a first sign-in, a mistyped credential, or one that was revoked or
// expired mid-session). What is typed goes to api.js, which keeps it in
// sessionStorage; it never goes into the page's URL.

import { ApiError, setTokenPrompt } from "./api.js";

/**
 * Makes the dialog of `ui` the way api.js asks for a credential;
 * `signedIn()` runs when one was given.
 */
export function installSignIn(ui, signedIn) {
  setTokenPrompt(
    (message) =>
      new Promise((resolve, reject) => {
        ui.tokenMessage.textContent = message;
        ui.tokenMessage.dataset.kind = /no longer accepts|refused/.test(message) ? "error" : "info";
        ui.tokenInput.value = "";
        let settled = false;
        const finish = () => {
          settled = true;
          ui.tokenForm.removeEventListener("submit", submitted);
          ui.tokenDialog.removeEventListener("close", closed);
        };
        const submitted = (event) => {
          event.preventDefault();
          const token = ui.tokenInput.value.trim();
          if (!token) {
            return;
          }
          finish();
          ui.tokenDialog.close();
          ui.askToken.hidden = true;
          signedIn();
          resolve(token);
        };
        const closed = () => {
          if (!settled) {
            finish();
            reject(new ApiError(401, "unauthorized", "no key or token was given"));
          }
        };
        ui.tokenForm.addEventListener("submit", submitted);
        ui.tokenDialog.addEventListener("close", closed);
        if (!ui.tokenDialog.open) {
          ui.tokenDialog.showModal();
        }
        ui.tokenInput.focus();
      }),
  );
}
