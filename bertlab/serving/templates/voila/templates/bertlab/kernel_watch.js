/* bertlab: a page whose kernel has gone (culled, shut down, crashed) says so and offers a reload,
   instead of waiting for widgets that can no longer come. Voila's page reaches its kernel through a
   websocket to .../api/kernels/<id>/channels. The server does not close that socket when it ends the
   kernel, so the page asks whether its kernel is still there (404: it is gone; no answer: the server
   is) when the socket closes, when the tab is shown again, and every CHECK_MS while it is on show. */
(function () {
  var Native = window.WebSocket;
  if (!Native) {
    return;
  }
  var CHECK_MS = 15000;
  var shown = false;
  var leaving = false;
  var kernelUrl = null;  // .../api/kernels/<id>, once the page has opened its kernel's socket
  window.addEventListener('beforeunload', function () { leaving = true; });

  function banner(text) {
    if (shown || leaving) {
      return;
    }
    shown = true;
    var box = document.createElement('div');
    box.className = 'bertlab-kernel-gone';
    box.setAttribute('role', 'alert');
    box.style.cssText = 'position:fixed;top:0;left:0;right:0;z-index:10000;padding:12px 16px;' +
      'background:#fdecec;color:#6b0b0b;border-bottom:2px solid #b00020;font:16px/1.4 sans-serif';
    var words = document.createElement('span');
    words.textContent = text + ' ';
    var reload = document.createElement('button');
    reload.className = 'bertlab-reload';
    reload.textContent = 'Reload the page';
    reload.style.cssText = 'font:inherit;padding:2px 10px;margin-left:6px;cursor:pointer';
    reload.addEventListener('click', function () { window.location.reload(); });
    box.appendChild(words);
    box.appendChild(reload);
    document.body.appendChild(box);
  }

  function check(restUrl) {
    if (shown || leaving) {
      return;
    }
    fetch(restUrl, { credentials: 'same-origin', cache: 'no-store' }).then(function (r) {
      if (r.status === 404) {
        banner('This page has lost its kernel (the server freed it, or it stopped): nothing you do here ' +
               'will run any more. Reload the page to get a new one.');
      }
    }).catch(function () {
      banner('The bertlab server does not answer: it may have stopped, or the network is down. ' +
             'Reload the page once it is back.');
    });
  }

  function Watched(url, protocols) {
    var ws = protocols === undefined ? new Native(url) : new Native(url, protocols);
    var found = /^(wss?)(:\/\/.*\/api\/kernels\/[^\/?#]+)\/channels/.exec(String(url));
    if (found) {
      var rest = (found[1] === 'wss' ? 'https' : 'http') + found[2];
      if (kernelUrl === null) {
        kernelUrl = rest;
        setInterval(function () {
          if (document.visibilityState === 'visible') {
            check(kernelUrl);
          }
        }, CHECK_MS);
        document.addEventListener('visibilitychange', function () {
          if (document.visibilityState === 'visible') {
            check(kernelUrl);
          }
        });
      }
      ws.addEventListener('close', function () {
        setTimeout(function () { check(rest); }, 1500);  // a reload's own close is not a loss
      });
    }
    return ws;
  }
  Watched.prototype = Native.prototype;
  ['CONNECTING', 'OPEN', 'CLOSING', 'CLOSED'].forEach(function (k) { Watched[k] = Native[k]; });
  window.WebSocket = Watched;
})();
