function render({ model, el }) {
  const tabWidth = () => {
    const box = el.closest(".bertlab-app")?.querySelector(".bertlab-tabs .widget-tab-contents");
    if (!box || !box.clientWidth) return Math.max(window.innerWidth - 80, 0);
    const cs = getComputedStyle(box);
    return Math.floor(box.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight) - 24);
  };
  const tell = () => {
    const width = tabWidth();
    if (model.get("query") === window.location.search && Math.abs(model.get("width") - width) < 40) return;
    model.set({ query: window.location.search, width });
    model.save_changes();
  };
  requestAnimationFrame(tell);
  let timer = null;
  const onResize = () => { clearTimeout(timer); timer = setTimeout(tell, 500); };
  window.addEventListener("resize", onResize);
  return () => window.removeEventListener("resize", onResize);
}
export default { render };
