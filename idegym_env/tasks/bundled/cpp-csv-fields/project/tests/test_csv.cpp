#include <stdexcept>
#include <string>
#include <vector>

#include "csv.hpp"
#include "harness.hpp"

using Fields = std::vector<std::string>;

static std::string show(const Fields& fields) {
    std::string out = "[";
    for (std::size_t i = 0; i < fields.size(); ++i) out += (i ? ", <" : "<") + fields[i] + ">";
    return out + "]";
}

#define CHECK_FIELDS(expected, line) CHECK_EQ(show(expected), show(csv::split_line(line)))

static void expect_invalid(const std::string& line) {
    try {
        csv::split_line(line);
    } catch (const std::invalid_argument&) {
        return;
    }
    throw harness::Failure{"split_line(" + line + ") should throw std::invalid_argument"};
}

int main(int argc, char** argv) {
    std::vector<std::pair<std::string, std::function<void()>>> tests = {
        {"plain_fields", [] { CHECK_FIELDS((Fields{"a", "b", "c"}), "a,b,c"); }},
        {"empty_fields", [] { CHECK_FIELDS((Fields{"", "x", ""}), ",x,"); }},
        {"empty_line_is_one_empty_field", [] { CHECK_FIELDS((Fields{""}), ""); }},
        {"quoted_field_with_comma", [] { CHECK_FIELDS((Fields{"Smith, Jane", "42"}), "\"Smith, Jane\",42"); }},
        {"doubled_quote_inside_quotes", [] { CHECK_FIELDS((Fields{"say \"hi\"", "ok"}), "\"say \"\"hi\"\"\",ok"); }},
        {"quoted_empty_field", [] { CHECK_FIELDS((Fields{"", "b"}), "\"\",b"); }},
        {"unterminated_quote_is_rejected", [] { expect_invalid("\"abc,def"); }},
        {"text_after_closing_quote_is_rejected", [] { expect_invalid("\"abc\"def,x"); }},
        {"join_then_split_round_trips", [] {
             Fields fields{"plain", "with, comma", "with \"quotes\"", ""};
             CHECK_EQ(show(fields), show(csv::split_line(csv::join_line(fields))));
         }},
    };
    return harness::run("csv", tests, argc > 1 ? argv[1] : "test-results.xml");
}
