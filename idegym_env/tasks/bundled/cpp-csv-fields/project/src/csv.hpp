#pragma once

#include <string>
#include <vector>

namespace csv {

// Split one line of CSV (RFC 4180) into its fields.
//
// Fields are separated by commas. A field may be enclosed in double quotes; inside quotes a
// comma is part of the field and a doubled quote ("") stands for one quote character. The quotes
// themselves are not part of the field. Throws std::invalid_argument for a quote that is never
// closed or text between a closing quote and the next comma.
std::vector<std::string> split_line(const std::string& line);

// The inverse: join fields into one line, quoting those that need it.
std::string join_line(const std::vector<std::string>& fields);

}  // namespace csv
