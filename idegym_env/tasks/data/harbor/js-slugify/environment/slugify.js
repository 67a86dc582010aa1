'use strict';

// TODO: implement (see the task's instruction).
function slugify(title, options = {}) {
  return title.toLowerCase().replace(/ /g, '-');
}

module.exports = { slugify };
