// corral dashboard: the token form a browser gets without a valid token (served as a file: the
// pages' Content-Security-Policy allows no inline script). The token is kept in the corral_token
// cookie, for this site's dashboard pages only (Secure when the page came over HTTPS), and the page
// is loaded again with it.
(function () {
  "use strict";
  document.getElementById("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const token = encodeURIComponent(document.getElementById("token").value.trim());
    const secure = location.protocol === "https:" ? "; Secure" : "";
    document.cookie = "corral_token=" + token + "; path=/; SameSite=Strict" + secure;
    location.reload();
  });
})();
