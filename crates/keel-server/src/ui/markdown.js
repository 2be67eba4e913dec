// Markdown for the model's answers, rendered safely: marked parses it,
// raw HTML in it is shown as text (never parsed: the model is not trusted),
// DOMPurify sanitizes what marked produced, links open in a new tab without
// an opener, and each code block gets a copy button and, when it names a
// language highlight.js knows, syntax highlighting. The page's content
// security policy keeps images and everything else to this origin.

import { Marked } from "./vendor/marked.esm.js";
import DOMPurify from "./vendor/purify.es.mjs";
import hljs from "./vendor/highlight.min.js";

const escapeHtml = (text) =>
  text.replaceAll("&", "&amp;").replaceAll("<", "&lt;").replaceAll(">", "&gt;").replaceAll('"', "&quot;");

const marked = new Marked({
  gfm: true,
  breaks: false,
  renderer: {
    // Raw HTML, block or inline, is text.
    html({ text }) {
      return escapeHtml(text);
    },
  },
});

// What highlighting may put in a code block: spans with classes, nothing else.
const HIGHLIGHT_SANITIZE = { ALLOWED_TAGS: ["span"], ALLOWED_ATTR: ["class"] };

/**
 * Highlights `code` (a sanitized `<code class="language-NAME">`) from its
 * text alone: whatever markup it held is not read, highlight.js escapes
 * the text, and its output is sanitized again to class-only spans. Blocks
 * without a known language stay plain (guessing costs time on long pages).
 */
function highlight(code) {
  const name = [...code.classList].find((name) => name.startsWith("language-"))?.slice("language-".length);
  if (!name || !hljs.getLanguage(name)) {
    return;
  }
  try {
    const { value } = hljs.highlight(code.textContent, { language: name, ignoreIllegals: true });
    code.innerHTML = DOMPurify.sanitize(value, HIGHLIGHT_SANITIZE);
    code.classList.add("hljs");
  } catch {
    // A block that cannot be highlighted is shown plain.
  }
}

/** Renders `text` as markdown into `element`, replacing what it held. */
export function renderMarkdown(element, text) {
  const html = marked.parse(text, { async: false });
  const clean = DOMPurify.sanitize(html, {
    USE_PROFILE: { html: true },
    FORBID_TAGS: ["style", "form", "input", "button", "textarea", "select"],
    FORBID_ATTR: ["style"],
  });
  const template = document.createElement("template");
  template.innerHTML = clean;
  const fragment = template.content;
  // Whitespace between blocks is layout, not text.
  for (const node of [...fragment.childNodes]) {
    if (node.nodeType === Node.TEXT_NODE && node.textContent.trim() === "") {
      node.remove();
    }
  }
  for (const link of fragment.querySelectorAll("a[href]")) {
    link.target = "_blank";
    link.rel = "noopener noreferrer";
  }
  for (const code of fragment.querySelectorAll("pre > code")) {
    highlight(code);
  }
  for (const pre of fragment.querySelectorAll("pre")) {
    const wrapper = document.createElement("div");
    wrapper.className = "code-block";
    const copy = document.createElement("button");
    copy.type = "button";
    copy.className = "copy-code";
    copy.dataset.testid = "copy-code";
    copy.textContent = "Copy";
    copy.addEventListener("click", async () => {
      try {
        await navigator.clipboard.writeText(pre.textContent);
        copy.textContent = "Copied";
      } catch {
        copy.textContent = "Copy failed";
      }
      setTimeout(() => {
        copy.textContent = "Copy";
      }, 1500);
    });
    pre.replaceWith(wrapper);
    wrapper.append(copy, pre);
  }
  element.replaceChildren(fragment);
  element.classList.add("markdown");
}
