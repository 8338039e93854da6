// Sortable and filterable tables, no dependencies: click a header to sort by it (again to
// reverse); a table with data-filter gets a text box that keeps the rows containing its text.
(function () {
  function cellValue(row, index) {
    var text = row.cells[index] ? row.cells[index].textContent.trim() : "";
    var number = parseFloat(text.replace(/,/g, ""));
    return isNaN(number) ? text.toLowerCase() : number;
  }
  function sortBy(table, index, header) {
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    var ascending = header.getAttribute("data-order") !== "asc";
    rows.sort(function (a, b) {
      var x = cellValue(a, index), y = cellValue(b, index);
      if (typeof x === typeof y) { return (x < y ? -1 : x > y ? 1 : 0) * (ascending ? 1 : -1); }
      return typeof x === "number" ? -1 : 1;  // numbers before dashes and words
    });
    rows.forEach(function (row) { body.appendChild(row); });
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (h) {
      h.removeAttribute("data-order");
    });
    header.setAttribute("data-order", ascending ? "asc" : "desc");
  }
  function addFilter(table) {
    var box = document.createElement("input");
    box.type = "search";
    box.placeholder = "filter rows (GPU, phase, predictor...)";
    box.className = "filter";
    box.addEventListener("input", function () {
      var wanted = box.value.toLowerCase();
      Array.prototype.forEach.call(table.tBodies[0].rows, function (row) {
        row.style.display = row.textContent.toLowerCase().indexOf(wanted) >= 0 ? "" : "none";
      });
    });
    table.parentNode.insertBefore(box, table);
  }
  document.addEventListener("DOMContentLoaded", function () {
    Array.prototype.forEach.call(document.querySelectorAll("table.sortable"), function (table) {
      Array.prototype.forEach.call(table.tHead.rows[0].cells, function (header, index) {
        header.addEventListener("click", function () { sortBy(table, index, header); });
      });
      if (table.hasAttribute("data-filter")) { addFilter(table); }
    });
  });
})();
