// Runs bertlab's attention view in a plain HTML page (no Jupyter): a small stand-in for the
// widget model over the state embedded in the page. Written for bertlab.
(function () {
  function base64ToBytes(text) {
    const bin = atob(text);
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }

  function makeModel(state) {
    const listeners = {};
    return {
      get: (key) => state[key],
      set(key, value) {
        const same = JSON.stringify(state[key]) === JSON.stringify(value);
        state[key] = value;
        if (!same) (listeners["change:" + key] || []).slice().forEach((cb) => cb());
      },
      save_changes() {},
      on(event, cb) {
        (listeners[event] = listeners[event] || []).push(cb);
      },
      off(event, cb) {
        listeners[event] = (listeners[event] || []).filter((x) => x !== cb);
      },
    };
  }

  const state = JSON.parse(document.getElementById("bertlab-attention-state").textContent);
  state.data = base64ToBytes(state.data);
  bertlabAttentionView.render({ model: makeModel(state), el: document.getElementById("bertlab-attention") });
})();
