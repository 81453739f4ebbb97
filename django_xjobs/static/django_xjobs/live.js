/* Live updates of the django-xjobs console (docs/console.md, "Live updates").
 *
 * Every few seconds (data-interval of #xjobs-live: XJOBS["CONSOLE_REFRESH"]) the page fetches
 * its own URL, so a list keeps its filters, search and page, with the header X-XJobs-Live (the
 * server then leaves its messages for the next page a person opens). Each region marked
 * data-xjobs-live whose HTML changed is put in place; on the jobs list, the rows are. What a
 * person is doing is left alone: a region with the focus in a field, or with text selected,
 * waits for a later round; open <details> and scrolled blocks stay as they were; the jobs list
 * updates its rows cell by cell and keeps every checkbox, and while jobs are checked or an
 * action is chosen its new and gone rows wait. Nothing is fetched while the tab is hidden; it
 * fetches at once when the tab is shown again. A failed fetch says since when the page is stale
 * and tries again after a pause that doubles, up to 5 minutes. One fetch at a time.
 */
"use strict";
(function () {
    const box = document.getElementById("xjobs-live");
    if (!box || !window.fetch || !window.DOMParser || !window.AbortController) {
        return;
    }
    const interval = Math.max(1000, Number(box.dataset.interval) || 5000);
    const LONGEST_PAUSE = 300000; // between two tries after failures
    const TIMEOUT = Math.max(20000, 2 * interval); // a fetch not answered by then failed
    const STOPPED = "xjobs-live-stopped"; // localStorage: the operator stopped the updates
    const label = box.querySelector(".xjobs-live-state");
    const toggle = box.querySelector(".xjobs-live-toggle");
    const seen = {}; // region name -> the server's HTML put in place last

    let timer = null;
    let inflight = null;
    let failures = 0;
    let updated = new Date(); // what the page shows is as new as this
    let problem = null; // why the last fetch failed
    let nextTry = null;
    let held = ""; // what the jobs list keeps back while jobs are selected
    let stopped = remembered();

    // The CSRF token of a form is masked afresh on every render: not a change.
    function signature(html) {
        return html.replace(/(name="csrfmiddlewaretoken" value=")[^"]*"/g, '$1"');
    }

    function remembered() {
        try {
            return window.localStorage.getItem(STOPPED) === "1";
        } catch (error) {
            return false;
        }
    }

    function remember(value) {
        try {
            if (value) {
                window.localStorage.setItem(STOPPED, "1");
            } else {
                window.localStorage.removeItem(STOPPED);
            }
        } catch (error) {
            // private windows may refuse storage: the toggle then lasts for this page only
        }
    }

    function hidden() {
        return document.visibilityState === "hidden";
    }

    function clock(moment) {
        return moment.toTimeString().slice(0, 8); // HH:MM:SS, the browser's time
    }

    function show() {
        let state;
        let text;
        if (stopped) {
            state = "stopped";
            text = "paused · updated " + clock(updated);
        } else if (hidden()) {
            state = "hidden";
            text = "paused while the tab is hidden · updated " + clock(updated);
        } else if (problem) {
            state = "stale";
            text = "stale since " + clock(updated) + " (" + problem + ") · next try at " +
                clock(nextTry);
        } else {
            state = "live";
            text = "live · updated " + clock(updated) + (held ? " · " + held : "");
        }
        box.dataset.state = state;
        label.textContent = text;
        toggle.textContent = stopped ? "resume" : "stop";
        toggle.setAttribute("aria-pressed", stopped ? "true" : "false");
        toggle.title = stopped ? "Update this page in place again" :
            "Stop updating this page (on every console page, until you resume)";
    }

    function schedule(delay) {
        clearTimeout(timer);
        timer = null;
        if (!stopped && !hidden()) {
            timer = setTimeout(tick, delay);
        }
    }

    function halt() {
        clearTimeout(timer);
        timer = null;
        if (inflight) {
            const request = inflight;
            inflight = null; // first: its failure is then no failure
            request.abort();
        }
    }

    function now() {
        clearTimeout(timer);
        timer = null;
        tick();
    }

    function count(name) {
        box.dataset[name] = String(Number(box.dataset[name] || 0) + 1);
    }

    async function tick() {
        timer = null;
        if (stopped || hidden() || inflight) {
            return;
        }
        const request = new AbortController();
        inflight = request;
        const limit = setTimeout(function () {
            request.abort();
        }, TIMEOUT);
        count("fetches");
        let pause = interval;
        try {
            const response = await fetch(window.location.href, {
                headers: {"X-XJobs-Live": "1"},
                credentials: "same-origin",
                cache: "no-store",
                signal: request.signal,
            });
            if (!response.ok) {
                throw new Error("HTTP " + response.status);
            }
            const page = new DOMParser().parseFromString(await response.text(), "text/html");
            if (inflight !== request) {
                return;
            }
            if (!page.getElementById("xjobs-live")) {
                throw new Error(response.redirected ? "signed out? reload the page" :
                    "another page came back");
            }
            apply(page);
            failures = 0;
            problem = null;
            updated = new Date();
            count("updates");
        } catch (error) {
            if (inflight !== request) {
                return; // stopped, or the tab was hidden: nothing failed
            }
            failures += 1;
            count("failures");
            problem = request.signal.aborted ? "no answer in " + TIMEOUT / 1000 + " s" :
                error instanceof TypeError ? "the server did not answer" : error.message;
            pause = Math.min(interval * 2 ** failures, LONGEST_PAUSE);
            nextTry = new Date(Date.now() + pause);
        } finally {
            clearTimeout(limit);
        }
        inflight = null;
        show();
        schedule(pause);
    }

    // ------------------------------------------------------------------------- regions --

    function busy(element, fields) {
        const focus = document.activeElement;
        if (focus && focus !== document.body && element.contains(focus) && focus.matches(fields)) {
            return true;
        }
        const chosen = window.getSelection ? window.getSelection() : null;
        return Boolean(chosen && !chosen.isCollapsed && chosen.rangeCount &&
            element.contains(chosen.getRangeAt(0).commonAncestorContainer));
    }

    // Fields a person types in or chooses from (a checkbox or a button is not held).
    const TYPING = "textarea, select, [contenteditable], input:not([type=checkbox])" +
        ":not([type=radio]):not([type=hidden]):not([type=submit]):not([type=button])";

    function detailsKey(details, index) {
        return details.dataset.xjobsKey || "#" + index;
    }

    // New content for `element` from `fresh`, keeping which <details> are open, how far each
    // <pre> is scrolled and the focus on a <summary>.
    function swap(element, fresh) {
        const open = new Map();
        let focused = null;
        element.querySelectorAll("details").forEach(function (details, index) {
            const key = detailsKey(details, index);
            open.set(key, details.open);
            if (document.activeElement === details.querySelector("summary")) {
                focused = key;
            }
        });
        const scrolled = Array.from(element.querySelectorAll("pre"), function (pre) {
            return [pre.scrollTop, pre.scrollLeft];
        });
        element.innerHTML = fresh.innerHTML;
        element.querySelectorAll("details").forEach(function (details, index) {
            const key = detailsKey(details, index);
            if (open.has(key)) {
                details.open = open.get(key);
            }
            if (key === focused) {
                details.querySelector("summary").focus({preventScroll: true});
            }
        });
        element.querySelectorAll("pre").forEach(function (pre, index) {
            if (scrolled[index]) {
                pre.scrollTop = scrolled[index][0];
                pre.scrollLeft = scrolled[index][1];
            }
        });
    }

    function apply(page) {
        document.querySelectorAll("[data-xjobs-live]").forEach(function (element) {
            const name = element.dataset.xjobsLive;
            const fresh = page.querySelector('[data-xjobs-live="' + name + '"]');
            if (!fresh) {
                return;
            }
            const html = signature(fresh.innerHTML);
            if (html === seen[name] || busy(element, TYPING)) {
                return; // unchanged, or in use: a later round puts it in place
            }
            swap(element, fresh);
            seen[name] = html;
        });
        const list = document.getElementById("changelist-form");
        const freshList = page.getElementById("changelist-form");
        held = list && freshList ? updateList(list, freshList) : "";
    }

    // ----------------------------------------------------------------------- the jobs list --

    function checkboxes() {
        return document.querySelectorAll("tr input.action-select");
    }

    function rowKey(row) {
        const box = row.querySelector("input.action-select");
        const link = row.querySelector("a[href]");
        return box ? box.value : link ? link.getAttribute("href") : row.textContent;
    }

    // Jobs checked, the "select all" across pages, or an action chosen: the rows stay.
    function selecting(form) {
        const action = form.querySelector("select[name=action]");
        const across = form.querySelector("input.select-across");
        return Array.from(checkboxes()).some(function (box) {
            return box.checked;
        }) || Boolean(action && action.value) || Boolean(across && across.value === "1");
    }

    function patchRow(row, fresh) {
        if (row.cells.length !== fresh.cells.length) {
            return;
        }
        for (let i = 0; i < row.cells.length; i++) {
            const cell = row.cells[i];
            if (!cell.querySelector("input.action-select") &&
                    cell.innerHTML !== fresh.cells[i].innerHTML) {
                swap(cell, fresh.cells[i]);
            }
        }
    }

    // The counter and the "select all" texts (their links keep the admin's handlers).
    function patchActions(form, fresh) {
        const counter = form.querySelector("span.action-counter");
        const freshCounter = fresh.querySelector("span.action-counter");
        if (counter && freshCounter) {
            counter.dataset.actionsIcnt = freshCounter.dataset.actionsIcnt;
            counter.textContent = freshCounter.textContent;
        }
        ["span.all", "span.question a"].forEach(function (selector) {
            const mine = form.querySelector(selector);
            const theirs = fresh.querySelector(selector);
            if (mine && theirs && mine.textContent !== theirs.textContent) {
                mine.textContent = theirs.textContent;
            }
        });
    }

    // What follows the rows in the form (the paginator, the count's note), child by child.
    function patchFooter(form, fresh) {
        function others(parent) {
            return Array.from(parent.children).filter(function (child) {
                return !child.matches("div.actions, div.results, input, script");
            });
        }
        const mine = others(form);
        const theirs = others(fresh);
        if (mine.length !== theirs.length) {
            return;
        }
        mine.forEach(function (child, i) {
            if (child.tagName === theirs[i].tagName &&
                    signature(child.innerHTML) !== signature(theirs[i].innerHTML) &&
                    !busy(child, TYPING)) {
                swap(child, theirs[i]);
            }
        });
    }

    function updateList(form, fresh) {
        if (busy(form, TYPING)) {
            return "waiting while you use the list";
        }
        const chosen = selecting(form);
        const table = form.querySelector("#result_list");
        const freshTable = fresh.querySelector("#result_list");
        if (!table || !freshTable) { // no rows before, or none now: the whole form is new
            if (chosen) {
                return "the list waits while jobs are selected";
            }
            if (signature(form.innerHTML) !== signature(fresh.innerHTML)) {
                form.innerHTML = fresh.innerHTML;
                if (freshTable && checkboxes().length && typeof window.Actions === "function") {
                    window.Actions(checkboxes()); // a table the admin's actions.js never saw
                }
            }
            return "";
        }
        const body = table.tBodies[0];
        const freshRows = Array.from(freshTable.tBodies[0].rows);
        const rows = new Map();
        Array.from(body.rows).forEach(function (row) {
            rows.set(rowKey(row), row);
        });
        const same = freshRows.length === body.rows.length && freshRows.every(function (row, i) {
            return rowKey(row) === rowKey(body.rows[i]);
        });
        let waiting = "";
        if (same || chosen) {
            freshRows.forEach(function (row) {
                const mine = rows.get(rowKey(row));
                if (mine) {
                    patchRow(mine, row);
                }
            });
            waiting = same ? "" : "new rows wait while jobs are selected";
        } else {
            body.replaceChildren.apply(body, freshRows.map(function (row) {
                return document.importNode(row, true);
            }));
            patchActions(form, fresh);
        }
        patchFooter(form, fresh);
        return waiting;
    }

    // The admin's actions.js keeps the checkboxes it found at load; rows put in place later
    // have new ones. It is handed a collection that is always the rows' checkboxes of now.
    if (document.getElementById("changelist-form") && typeof window.Actions === "function") {
        const actions = window.Actions;
        const boxes = {
            get length() {
                return checkboxes().length;
            },
            forEach: function (each) {
                checkboxes().forEach(each);
            },
            [Symbol.iterator]: function () {
                return checkboxes()[Symbol.iterator]();
            },
        };
        window.Actions = function (found, options) {
            return actions(boxes, options);
        };
    }

    // -------------------------------------------------------------------------- start --

    document.querySelectorAll("[data-xjobs-live]").forEach(function (element) {
        seen[element.dataset.xjobsLive] = signature(element.innerHTML);
    });
    toggle.addEventListener("click", function () {
        stopped = !stopped;
        remember(stopped);
        if (stopped) {
            halt();
        } else {
            failures = 0;
            problem = null;
            now();
        }
        show();
    });
    document.addEventListener("visibilitychange", function () {
        if (hidden()) {
            halt();
        } else if (!stopped) {
            now(); // at once: the page may be minutes old
        }
        show();
    });
    window.addEventListener("pageshow", function (event) {
        if (event.persisted && !stopped && !hidden()) {
            now(); // back from the browser's cache
        }
    });
    box.hidden = false;
    show();
    schedule(interval);
})();
