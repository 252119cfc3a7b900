// POET Edge fleet dashboard: the fleet table's pages and live refresh, confirmation of revocations.
// Data is written with textContent only (never innerHTML), so nothing a device reports can become markup.
"use strict";

(function () {
  function confirmRevocations() {
    document.querySelectorAll("form[data-confirm]").forEach(function (form) {
      form.addEventListener("submit", function (event) {
        if (!window.confirm(form.dataset.confirm)) {
          event.preventDefault();
        }
      });
    });
  }

  // The fleet table shows one page the server picked (search, filters, sort and paging run in its database).
  // Each refresh sends the cursor of the previous answer: the server answers with the page's device names in
  // order and full rows only for the devices that changed, and only those rows' cells are rewritten, so an
  // operator's text selection elsewhere in the table survives.
  function fleetTable() {
    var table = document.getElementById("fleet");
    if (!table) {
      return;
    }
    var form = document.getElementById("filter-form");
    var body = document.getElementById("fleet-body");
    var search = document.getElementById("search");
    var keys = Array.prototype.map.call(table.querySelectorAll("thead th[data-key]"), function (th) {
      return th.dataset.key;
    });
    var source = table.dataset.source;
    var every = Number(table.dataset.refreshMs) || 3000;
    var params = new URLSearchParams(window.location.search);
    var rows = {};  // name -> its <tr>
    var cursor = null;  // the previous answer's cursor, while it answered the same query
    var asked = 0;  // requests made; an answer to an older one is dropped
    var typing = null;

    Array.prototype.forEach.call(body.querySelectorAll("tr[data-device]"), function (tr) {
      rows[tr.dataset.device] = tr;
    });

    function setText(node, text) {
      if (node.textContent !== text) {
        node.textContent = text;
      }
    }

    function newRow(name) {
      var tr = document.createElement("tr");
      tr.dataset.device = name;
      keys.forEach(function (key) {
        var td = document.createElement("td");
        td.className = "c-" + key;
        if (key === "name") {
          var link = document.createElement("a");
          link.href = "/devices/" + encodeURIComponent(name);
          link.textContent = name;
          td.appendChild(link);
        }
        tr.appendChild(td);
      });
      return tr;
    }

    function fill(tr, row) {
      tr.dataset.state = row.state;
      keys.forEach(function (key, i) {
        if (key === "name") {
          return;
        }
        var td = tr.children[i];
        setText(td, row.cells[key]);
        if (key === "online" && td.title !== "last seen " + row.last_seen) {
          td.title = "last seen " + row.last_seen;
        }
      });
    }

    function draw(data) {
      data.rows.forEach(function (row) {
        fill(rows[row.name] || (rows[row.name] = newRow(row.name)), row);
      });
      var online = keys.indexOf("online");
      var wanted = {};
      data.names.forEach(function (name, i) {
        var tr = rows[name];
        wanted[name] = true;
        var status = "device-row status-" + data.online[i][0];
        if (tr.className !== status) {
          tr.className = status;
        }
        setText(tr.children[online], data.online[i][1]);
        if (body.children[i] !== tr) {
          body.insertBefore(tr, body.children[i] || null);
        }
      });
      Object.keys(rows).forEach(function (name) {
        if (!wanted[name]) {
          rows[name].remove();
          delete rows[name];
        }
      });
      drawAround(data);
    }

    function drawAround(data) {
      ["devices", "online", "training", "offline", "revoked"].forEach(function (key) {
        setText(document.getElementById("count-" + key), data.counts[key].toLocaleString("en-US"));
      });
      setText(document.getElementById("fleet-count"),
              data.total.toLocaleString("en-US") + (data.total === 1 ? " device" : " devices"));
      var last = data.first + data.names.length - 1;
      setText(document.getElementById("page-position"), data.names.length === 0 ? "" :
              data.first.toLocaleString("en-US") + "\u2013" + last.toLocaleString("en-US") + " of " +
              data.total.toLocaleString("en-US") + ", page " + data.page + " of " + data.pages);
      pagerLink("page-prev", data.links.prev);
      pagerLink("page-next", data.links.next);
      table.querySelectorAll("thead th[data-sort]").forEach(function (th) {
        var sorted = th.dataset.key === data.links.sorted;
        th.classList.toggle("sorted", sorted);
        th.classList.toggle("asc", sorted && data.links.order === "asc");
        th.classList.toggle("desc", sorted && data.links.order === "desc");
        if (sorted) {
          th.setAttribute("aria-sort", data.links.order === "asc" ? "ascending" : "descending");
        } else {
          th.removeAttribute("aria-sort");
        }
        th.querySelector("a").href = data.links.sort[th.dataset.key];
      });
      var empty = document.getElementById("fleet-empty");
      empty.hidden = data.names.length > 0;
      setText(empty, data.counts.devices ? "No device matches." : empty.textContent);
      var updated = document.getElementById("fleet-updated");
      setText(updated, "updated " + data.updated);
      updated.classList.remove("stale");
    }

    function pagerLink(id, href) {
      var link = document.getElementById(id);
      link.hidden = !href;
      if (href) {
        link.href = href;
      }
    }

    function refresh() {
      var url = new URL(source, window.location.href);
      params.forEach(function (value, key) { url.searchParams.set(key, value); });
      if (cursor !== null) {
        url.searchParams.set("since", String(cursor));
      }
      var number = ++asked;
      fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" }, cache: "no-store" })
        .then(function (response) {
          if (response.status === 401) {
            window.location.assign("/login");
            return null;
          }
          if (!response.ok) {
            throw new Error("HTTP " + response.status);
          }
          return response.json();
        })
        .then(function (data) {
          if (data === null || number !== asked) {
            return;
          }
          var missing = data.names.some(function (name) { return !rows[name]; });
          if (!data.complete && missing) {
            cursor = null;  // a device came into the page without changing: ask for the whole page
            refresh();
            return;
          }
          draw(data);
          cursor = data.cursor;
        })
        .catch(function () {
          if (number !== asked) {
            return;
          }
          var updated = document.getElementById("fleet-updated");
          updated.classList.add("stale");
          setText(updated, "cannot reach the server; retrying");
        });
    }

    function show(next) {
      params = next;
      var query = params.toString();
      window.history.replaceState(null, "", query ? "/?" + query : "/");
      cursor = null;
      refresh();
    }

    function fromForm() {
      var next = new URLSearchParams(params);
      next.delete("page");
      ["q", "status", "state"].forEach(function (name) {
        var value = form.elements[name].value.trim();
        if (value) {
          next.set(name, value);
        } else {
          next.delete(name);
        }
      });
      show(next);
    }

    form.addEventListener("change", fromForm);
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      fromForm();
    });
    search.addEventListener("input", function () {
      window.clearTimeout(typing);
      typing = window.setTimeout(fromForm, 300);
    });
    document.querySelectorAll("#pager a, #fleet thead a.sort").forEach(function (link) {
      link.addEventListener("click", function (event) {
        event.preventDefault();
        show(new URL(link.href).searchParams);
      });
    });
    refresh();
    window.setInterval(refresh, every);
  }

  document.addEventListener("DOMContentLoaded", function () {
    confirmRevocations();
    fleetTable();
  });
})();
