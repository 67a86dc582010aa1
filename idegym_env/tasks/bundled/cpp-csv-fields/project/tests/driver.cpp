// The judge's driver for csv: the tests (test_csv.py) call split_line and join_line of
// src/csv.cpp through it, one request a line.
#include "judge_driver.h"

#include <stdexcept>
#include <string>
#include <vector>

#include "csv.hpp"

static void answer_fields(const std::vector<std::string>& fields) {
    jd_begin();
    jd_w_raw("[");
    for (std::size_t i = 0; i < fields.size(); ++i) {
        if (i) jd_w_raw(",");
        jd_w_string(fields[i].data(), fields[i].size());
    }
    jd_w_raw("]");
    jd_end();
}

int main() {
    jd_request req = {};
    while (jd_next(&req)) {
        try {
            if (jd_op(&req, "split_line")) {
                answer_fields(csv::split_line(std::string(jd_str(&req, 0), jd_strlen(&req, 0))));
            } else if (jd_op(&req, "join_line")) {
                std::vector<std::string> fields;
                const jd_value* list = jd_array(&req, 0);
                for (std::size_t i = 0; i < list->length; ++i) {
                    const jd_value& item = list->items[i];
                    fields.emplace_back(item.string ? item.string : "", item.length);
                }
                std::string line = csv::join_line(fields);
                jd_ok_string(line.data(), line.size());
            } else {
                jd_unknown(&req);
            }
        } catch (const std::invalid_argument& exc) {
            jd_err("std::invalid_argument", exc.what());
        } catch (const std::exception& exc) {
            jd_err("std::exception", exc.what());
        }
    }
    jd_release(&req);
    return 0;
}
