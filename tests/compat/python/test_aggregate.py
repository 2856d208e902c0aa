"""Aggregation stages through pymongo."""

import pytest
from pymongo.errors import OperationFailure


@pytest.fixture
def sales(db):
    db.sales.insert_many(
        [
            {"_id": 1, "item": "a", "price": 10, "qty": 2, "tags": ["x", "y"]},
            {"_id": 2, "item": "b", "price": 20, "qty": 1, "tags": ["x"]},
            {"_id": 3, "item": "a", "price": 5, "qty": 10, "tags": []},
            {"_id": 4, "item": "c", "price": 7, "qty": 3},
        ]
    )
    return db.sales


def test_match_group_sort(sales):
    got = list(
        sales.aggregate(
            [
                {"$match": {"price": {"$gte": 5}}},
                {"$sort": {"_id": 1}},
                {
                    "$group": {
                        "_id": "$item",
                        "total": {"$sum": {"$multiply": ["$price", "$qty"]}},
                        "n": {"$sum": 1},
                        "avg": {"$avg": "$price"},
                        "ids": {"$push": "$_id"},
                        "first": {"$first": "$_id"},
                        "last": {"$last": "$_id"},
                        "max": {"$max": "$qty"},
                        "min": {"$min": "$qty"},
                    }
                },
                {"$sort": {"total": -1}},
            ]
        )
    )
    assert got == [
        {"_id": "a", "total": 70, "n": 2, "avg": 7.5, "ids": [1, 3], "first": 1, "last": 3, "max": 10, "min": 2},
        {"_id": "c", "total": 21, "n": 1, "avg": 7.0, "ids": [4], "first": 4, "last": 4, "max": 3, "min": 3},
        {"_id": "b", "total": 20, "n": 1, "avg": 20.0, "ids": [2], "first": 2, "last": 2, "max": 1, "min": 1},
    ]
    assert isinstance(got[0]["avg"], float)


def test_project_unwind_count(sales):
    got = list(sales.aggregate([{"$sort": {"_id": 1}}, {"$project": {"_id": 0, "item": 1, "rev": {"$multiply": ["$price", "$qty"]}}}]))
    assert got[0] == {"item": "a", "rev": 20}
    got = list(sales.aggregate([{"$unwind": "$tags"}, {"$sort": {"_id": 1, "tags": 1}}, {"$project": {"tags": 1}}]))
    assert got == [{"_id": 1, "tags": "x"}, {"_id": 1, "tags": "y"}, {"_id": 2, "tags": "x"}]
    got = list(
        sales.aggregate(
            [
                {"$unwind": {"path": "$tags", "preserveNullAndEmptyArrays": True, "includeArrayIndex": "i"}},
                {"$sort": {"_id": 1, "i": 1}},
                {"$project": {"tags": 1, "i": 1}},
            ]
        )
    )
    assert got == [
        {"_id": 1, "tags": "x", "i": 0},
        {"_id": 1, "tags": "y", "i": 1},
        {"_id": 2, "tags": "x", "i": 0},
        {"_id": 3, "i": None},
        {"_id": 4, "i": None},
    ]
    assert list(sales.aggregate([{"$match": {"price": {"$gt": 6}}}, {"$count": "n"}])) == [{"n": 3}]
    assert list(sales.aggregate([{"$match": {"price": {"$gt": 600}}}, {"$count": "n"}])) == []


def test_skip_limit_addfields_unset(sales):
    got = list(sales.aggregate([{"$sort": {"price": 1}}, {"$skip": 1}, {"$limit": 2}, {"$project": {"_id": 1}}]))
    assert got == [{"_id": 4}, {"_id": 1}]
    got = list(sales.aggregate([{"$match": {"_id": 1}}, {"$addFields": {"rev": {"$multiply": ["$price", "$qty"]}}}, {"$unset": ["tags", "qty"]}]))
    assert got == [{"_id": 1, "item": "a", "price": 10, "rev": 20}]
    got = list(sales.aggregate([{"$group": {"_id": None, "q": {"$sum": "$qty"}}}]))
    assert got == [{"_id": None, "q": 16}]


def test_aggregate_cursor_batches(db):
    db.c.insert_many([{"_id": i} for i in range(1000)])
    got = [d["_id"] for d in db.c.aggregate([{"$sort": {"_id": 1}}], batchSize=7)]
    assert got == list(range(1000))


def test_aggregate_errors(sales):
    with pytest.raises(OperationFailure) as e:
        list(sales.aggregate([{"$foo": 1}]))
    assert e.value.code == 40324
    with pytest.raises(OperationFailure) as e:
        list(sales.aggregate([{"$group": {"n": {"$sum": 1}}}]))
    assert e.value.code == 15955
