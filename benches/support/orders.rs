//! A generated CSV of orders, the large tool result of the large-payload benchmark
//! (`benches/files.rs`) and of `examples/large_payload.rs`.

/// A CSV of orders (header + rows) of at least `min_bytes` bytes, and its number of rows.
pub fn orders_csv(min_bytes: usize) -> (String, usize) {
    let mut csv = String::from("order_id,customer,region,quantity,unit_price,order_date\n");
    let mut rows = 0usize;
    while csv.len() < min_bytes {
        let i = rows;
        csv.push_str(&format!(
            "{},customer-{:05},{},{},{}.{:02},2026-{:02}-{:02}\n",
            100_000 + i,
            i * 7 % 10_000,
            ["north", "south", "east", "west"][i % 4],
            1 + i % 9,
            5 + i % 200,
            i % 100,
            1 + i % 12,
            1 + i % 28
        ));
        rows += 1;
    }
    (csv, rows)
}
