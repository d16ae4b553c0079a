"""Matching events against many subscriptions (the 001 document's two-stage algorithms)."""

from flowbus.errors import SubscriptionError
from flowbus.matching.matcher import Matcher, Strategy

__all__ = ["Matcher", "Strategy", "SubscriptionError"]
