#!/bin/bash
set -e
cat > /app/query.sql <<'SQL'
SELECT c.name AS name, ROUND(SUM(i.quantity * i.unit_price), 2) AS total
FROM customers AS c
JOIN orders AS o ON o.customer_id = c.id
JOIN order_items AS i ON i.order_id = o.id
WHERE o.placed_at >= '2024-01-01' AND o.placed_at < '2025-01-01' AND o.status <> 'cancelled'
GROUP BY c.id
ORDER BY total DESC, name ASC
LIMIT 3;
SQL
