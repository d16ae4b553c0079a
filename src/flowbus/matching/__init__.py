"""Matching events against many subscriptions (the 001 document's two-stage algorithms)."""

from flowbus.matching.matcher import Matcher, Strategy, SubscriptionError

__all__ = ["Matcher", "Strategy", "SubscriptionError"]
