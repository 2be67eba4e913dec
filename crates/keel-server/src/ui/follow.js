// Keeps the conversation at its newest content while the reader follows it.
//
// "Following" is a state, not a measure taken per event: it starts on, and
// only the reader's own scrolling (wheel, touch, keys, the scrollbar)
// changes it. Scrolling up turns it off; scrolling back to the bottom turns
// it on again. Programmatic scrolls and content that grows (a markdown
// render a frame later, a code block, an approval card) never turn it off:
// a ResizeObserver on the content sticks to the bottom whenever the content
// or the pane changes size while following. While the reader is away, a
// MutationObserver counts the items added, shown on the "Jump to latest"
// control, which scrolls down and follows again.

/** How close to the bottom (px) the reader's scroll counts as "at the end". */
const AT_END = 24;

/** Keys that scroll a focused pane upwards (or away from the end). */
const UP_KEYS = new Set(["ArrowUp", "PageUp", "Home"]);
const SCROLL_KEYS = new Set(["ArrowUp", "ArrowDown", "PageUp", "PageDown", "Home", "End", " "]);

export class Follower {
  /**
   * `scroller` is the element that scrolls, `content` the element inside it
   * that grows; `jump` the "Jump to latest" button and `count` the element
   * that shows how many items arrived since the reader scrolled away.
   */
  constructor({ scroller, content, jump, count }) {
    this.scroller = scroller;
    this.content = content;
    this.jump = jump;
    this.countElement = count;
    this.following = true;
    this.unseen = 0;
    // Whether the content grew since the reader scrolled away.
    this.fresh = false;
    // Until when a scroll event is the reader's own (ms, performance.now()).
    this.intentUntil = 0;
    this.dragging = false;

    const intent = (ms) => {
      this.intentUntil = Math.max(this.intentUntil, performance.now() + ms);
    };
    scroller.addEventListener(
      "wheel",
      (event) => {
        intent(300);
        if (event.deltaY < 0) {
          this.leave();
        }
      },
      { passive: true },
    );
    let touchY = null;
    scroller.addEventListener(
      "touchstart",
      (event) => {
        touchY = event.touches[0]?.clientY ?? null;
        intent(1000);
      },
      { passive: true },
    );
    scroller.addEventListener(
      "touchmove",
      (event) => {
        const y = event.touches[0]?.clientY;
        intent(1000);
        // A finger moving down drags the content down: towards older items.
        if (touchY !== null && y !== undefined && y > touchY + 2) {
          this.leave();
        }
        touchY = y ?? touchY;
      },
      { passive: true },
    );
    // Momentum keeps scrolling after the finger lifts.
    scroller.addEventListener("touchend", () => intent(1500), { passive: true });
    // Keys scroll the pane when the focus is in it or on nothing in particular.
    document.addEventListener("keydown", (event) => {
      const target = event.target;
      const here = target === document.body || target === scroller || scroller.contains(target);
      if (SCROLL_KEYS.has(event.key) && here && !target.closest?.("input, textarea, select, button, summary")) {
        intent(600);
        if (UP_KEYS.has(event.key) || (event.key === " " && event.shiftKey)) {
          this.leave();
        }
      }
    });
    // A press on the pane itself (not on an item in it) is its scrollbar.
    scroller.addEventListener("pointerdown", (event) => {
      if (event.target === scroller) {
        this.dragging = true;
      }
    });
    window.addEventListener("pointerup", () => {
      if (this.dragging) {
        this.dragging = false;
        intent(200);
      }
    });
    scroller.addEventListener(
      "scroll",
      () => {
        if (!this.dragging && performance.now() > this.intentUntil) {
          return;
        }
        // A chain of scroll events (momentum, a smooth scroll) stays the reader's.
        intent(150);
        if (this.distance() <= AT_END) {
          this.follow();
        } else {
          this.leave();
        }
      },
      { passive: true },
    );
    jump.addEventListener("click", () => this.follow({ scroll: true }));

    new ResizeObserver(() => {
      if (this.following) {
        this.stick();
      } else if (!this.fresh) {
        // Something below grew (an answer streaming): say there is more.
        this.fresh = true;
        this.render();
      }
    }).observe(content);
    new ResizeObserver(() => {
      if (this.following) {
        this.stick();
      }
    }).observe(scroller);
    new MutationObserver((records) => {
      if (this.following) {
        return;
      }
      let added = 0;
      for (const record of records) {
        for (const node of record.addedNodes) {
          if (node.nodeType === Node.ELEMENT_NODE && !node.hidden) {
            added += 1;
          }
        }
      }
      if (added) {
        this.unseen += added;
        this.render();
      }
    }).observe(content, { childList: true });
    this.render();
  }

  /** How far (px) the pane is from its bottom. */
  distance() {
    const scroller = this.scroller;
    return scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight;
  }

  /** The reader went away from the end: stop following, if there is anywhere to go. */
  leave() {
    if (!this.following || this.scroller.scrollHeight <= this.scroller.clientHeight) {
      return;
    }
    this.following = false;
    this.unseen = 0;
    this.fresh = false;
    this.render();
  }

  /** Follows the newest content again; with `scroll`, goes there now. */
  follow({ scroll = false } = {}) {
    const was = this.following;
    this.following = true;
    this.unseen = 0;
    this.fresh = false;
    if (scroll || !was) {
      this.stick();
    }
    this.render();
  }

  /** A fresh conversation: follow it from its start. */
  reset() {
    this.following = true;
    this.unseen = 0;
    this.fresh = false;
    this.intentUntil = 0;
    this.render();
  }

  /** Scrolls to the bottom (a programmatic scroll: it changes no state). */
  stick() {
    this.scroller.scrollTop = this.scroller.scrollHeight;
  }

  render() {
    this.jump.hidden = this.following;
    this.scroller.dataset.following = String(this.following);
    this.countElement.textContent = this.unseen ? `${this.unseen} new` : this.fresh ? "new" : "";
    this.jump.dataset.fresh = String(this.fresh || this.unseen > 0);
    this.jump.setAttribute(
      "aria-label",
      this.unseen ? `Jump to the latest: ${this.unseen} new` : this.fresh ? "Jump to the latest: more below" : "Jump to the latest",
    );
  }
}
