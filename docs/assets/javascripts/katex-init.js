// Render math with the KaTeX copy served from this site. Material's instant navigation
// swaps page content without a reload, so render on every document$ emission; and since
// document$ never emits on a copy of the site opened from file://, render once the page
// has loaded too. Rendering twice is harmless: typeset math keeps no $ delimiters.
(function () {
  function render() {
    renderMathInElement(document.body, {
      delimiters: [
        { left: "$$", right: "$$", display: true },
        { left: "$", right: "$", display: false },
        { left: "\\(", right: "\\)", display: false },
        { left: "\\[", right: "\\]", display: true },
      ],
      throwOnError: false,
    });
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", render);
  } else {
    render();
  }
  if (typeof document$ !== "undefined" && document$.subscribe) {
    document$.subscribe(render);
  }
})();
