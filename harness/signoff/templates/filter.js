(function () {
  var box = document.getElementById('only-problems');
  if (!box) { return; }
  box.addEventListener('change', function () {
    var rows = document.querySelectorAll('#verdict-matrix tbody tr');
    for (var i = 0; i < rows.length; i++) {
      rows[i].hidden = box.checked && !rows[i].classList.contains('has-problem');
    }
  });
})();
