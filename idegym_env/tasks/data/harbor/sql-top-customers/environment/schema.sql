CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER NOT NULL REFERENCES customers(id),
                     placed_at TEXT NOT NULL, status TEXT NOT NULL);
CREATE TABLE order_items (order_id INTEGER NOT NULL REFERENCES orders(id), product TEXT NOT NULL,
                          quantity INTEGER NOT NULL, unit_price REAL NOT NULL);
INSERT INTO customers VALUES (1, 'Ada'), (2, 'Brendan'), (3, 'Chen'), (4, 'Dana'), (5, 'Eve');
INSERT INTO orders VALUES
  (1, 1, '2024-01-05', 'shipped'), (2, 1, '2023-12-31', 'shipped'), (3, 2, '2024-03-10', 'shipped'),
  (4, 3, '2024-06-01', 'cancelled'), (5, 3, '2024-07-01', 'shipped'), (6, 4, '2024-12-31', 'pending'),
  (7, 5, '2025-01-01', 'shipped');
INSERT INTO order_items VALUES
  (1, 'pen', 10, 1.5), (1, 'ink', 2, 7.25), (2, 'paper', 100, 0.1), (3, 'desk', 1, 120.0),
  (4, 'chair', 2, 80.0), (5, 'lamp', 1, 25.0), (6, 'pen', 20, 1.5), (6, 'paper', 10, 0.1),
  (7, 'desk', 3, 120.0);
