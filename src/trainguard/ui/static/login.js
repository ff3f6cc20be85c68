/* The service dashboard's login: the credential goes to POST api/login once; a session cookie comes back. */
(function () {
  "use strict";
  const form = document.getElementById("login");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const value = (id) => document.getElementById(id).value.trim();
    const body = value("api_token") ? { api_token: value("api_token") }
      : { access_key_id: value("access_key_id"), secret_access_key: value("secret_access_key") };
    const response = await fetch("api/login", { method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
    if (response.ok) { window.location.href = "./"; return; }
    const error = document.getElementById("error");
    error.textContent = ((await response.json().catch(() => ({}))).error) || "HTTP " + response.status;
    error.hidden = false;
  });
})();
