//! shoal's query language: pure functions over BSON (no I/O, no storage).
//! Comparison order, filters, projections, sorts, aggregation expressions,
//! update operators and the aggregation pipeline, all following MongoDB 7.0.

pub mod agg;
pub mod compare;
mod datetime;
pub mod decimal;
pub mod expr;
pub mod filter;
pub mod let_vars;
mod num;
pub mod projection;
pub mod sort;
pub mod update;

#[cfg(test)]
mod tests {
    fn assert_shareable<T: Clone + Send + Sync + std::fmt::Debug>() {}

    #[test]
    fn parsed_forms_are_shareable_across_threads() {
        assert_shareable::<crate::filter::Filter>();
        assert_shareable::<crate::projection::Projection>();
        assert_shareable::<crate::sort::SortSpec>();
        assert_shareable::<crate::expr::Expr>();
        assert_shareable::<crate::update::Update>();
        assert_shareable::<crate::agg::Pipeline>();
    }
}
