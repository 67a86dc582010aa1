CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id),
                     placed_at TEXT NOT NULL, status TEXT NOT NULL);
CREATE TABLE order_items (order_id INTEGER NOT NULL REFERENCES orders(id), product TEXT NOT NULL,
                          quantity INTEGER NOT NULL, unit_price REAL NOT NULL);
INSERT INTO customers VALUES (1, 'Zed'), (2, 'Yara'), (3, 'Xavi'), (4, 'Wu'), (5, 'Vic');
INSERT INTO orders VALUES
  (1, 1, '2024-02-02', 'shipped'), (2, 2, '2024-02-03', 'shipped'), (3, 3, '2024-05-05', 'shipped'),
  (4, 3, '2024-05-06', 'shipped'), (5, 4, '2024-08-08', 'shipped'), (6, 5, '2024-09-09', 'cancelled'),
  (7, 4, '2024-10-10', 'cancelled');
INSERT INTO order_items VALUES
  (1, 'a', 3, 10.0), (2, 'b', 1, 30.0), (3, 'c', 1, 5.5), (4, 'd', 2, 2.0), (5, 'e', 1, 9.99),
  (6, 'f', 100, 100.0), (7, 'g', 100, 100.0);
