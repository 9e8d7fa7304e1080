/* bertlab: this page says at once that it runs in a browser. The server frees within seconds a kernel
   whose page never runs (a plain request for the page, no browser), and keeps it for a page that does,
   however long its code then takes to load on a busy server. The kernel's id is in the page's
   configuration, which Voila writes once the kernel is there: look for it until it is. */
(function () {
  var tries = 0;
  function hello() {
    var config = document.getElementById('jupyter-config-data');
    if (!config) {
      tries += 1;
      if (tries < 2400) {
        setTimeout(hello, 250);
      }
      return;
    }
    var data;
    try {
      data = JSON.parse(config.textContent);
    } catch (e) {
      return;
    }
    if (!data.kernelId) {
      return;
    }
    var xsrf = (document.cookie.match(/(?:^|;\s*)_xsrf=([^;]*)/) || [])[1];
    fetch((data.baseUrl || '/') + 'bertlab/api/seat/' + data.kernelId, {
      method: 'POST',
      credentials: 'same-origin',
      headers: xsrf ? { 'X-XSRFToken': decodeURIComponent(xsrf) } : {}
    }).catch(function () {});
  }
  hello();
})();
