"""Twenty varied prompts (maths, chat, code) for the integration tests."""

PROMPTS = [
    "What is 17 times 23? Show your steps.",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did she sell altogether?",
    "A train travels 60 miles per hour for 3 hours. How far does it go?",
    "Solve for x: 3x + 7 = 22.",
    "What is the sum of the first 10 positive integers?",
    "If a shirt costs $20 and is on sale for 25% off, what is the sale price?",
    "Write a Python function that checks whether a string is a palindrome.",
    "Write a JavaScript function that returns the largest number in an array.",
    "Explain what a hash map is and give a short Python example.",
    "Write a SQL query that counts the rows in a table named users.",
    "What is the capital of France?",
    "Give me three tips for sleeping better.",
    "Tell me a short story about a robot who learns to paint.",
    "What are the main causes of climate change?",
    "Explain the difference between weather and climate.",
    "How do I make a cup of tea?",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    "What is the United States of America's largest state by area?",
    "Translate 'good morning, how are you?' into Spanish.",
    "List five fruits that are rich in vitamin C.",
]
