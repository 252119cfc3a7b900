// POET Edge fleet dashboard: live refresh of the fleet table, its state filter, confirmation of revocations.
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

  function fleetTable() {
    var table = document.getElementById("fleet");
    if (!table) {
      return;
    }
    var body = document.getElementById("fleet-body");
    var filter = document.getElementById("state-filter");
    var count = document.getElementById("fleet-count");
    var updated = document.getElementById("fleet-updated");
    var empty = document.getElementById("fleet-empty");
    var keys = Array.prototype.map.call(table.querySelectorAll("thead th[data-key]"), function (th) {
      return th.dataset.key;
    });
    var source = table.dataset.source;
    var every = Number(table.dataset.refreshMs) || 3000;
    var devices = null;

    function cell(row, key) {
      var td = document.createElement("td");
      td.className = "c-" + key;
      if (key === "name") {
        var link = document.createElement("a");
        link.href = "/devices/" + encodeURIComponent(row.name);
        link.textContent = row.name;
        td.appendChild(link);
      } else {
        td.textContent = row.cells[key];
        if (key === "online") {
          td.title = "last seen " + row.last_seen;
        }
      }
      return td;
    }

    function render() {
      if (devices === null) {
        return;
      }
      var wanted = filter.value;
      var shown = devices.filter(function (row) { return !wanted || row.state === wanted; });
      var rows = shown.map(function (row) {
        var tr = document.createElement("tr");
        tr.className = "device-row status-" + row.status;
        tr.dataset.device = row.name;
        tr.dataset.state = row.state;
        keys.forEach(function (key) { tr.appendChild(cell(row, key)); });
        return tr;
      });
      body.replaceChildren.apply(body, rows);
      count.textContent = shown.length + (shown.length === 1 ? " device" : " devices");
      empty.hidden = shown.length > 0;
    }

    function refresh() {
      fetch(source, { credentials: "same-origin", headers: { Accept: "application/json" }, cache: "no-store" })
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
          if (data === null) {
            return;
          }
          devices = data.devices;
          render();
          updated.textContent = "updated " + data.updated;
          updated.classList.remove("stale");
        })
        .catch(function () {
          updated.classList.add("stale");
          updated.textContent = "cannot reach the server; retrying";
        });
    }

    filter.addEventListener("change", function () {
      var url = new URL(window.location.href);
      if (filter.value) {
        url.searchParams.set("state", filter.value);
      } else {
        url.searchParams.delete("state");
      }
      window.history.replaceState(null, "", url);
      render();
    });
    refresh();
    window.setInterval(refresh, every);
  }

  document.addEventListener("DOMContentLoaded", function () {
    confirmRevocations();
    fleetTable();
  });
})();
