"""The prompt templates and slot word lists of the self-distillation prompts (:mod:`.prompts`).

Written for this package: none is MT-Bench's or HumanEval's. ``CATEGORIES`` maps each category to its
templates and its weight in the mix (MT-Bench's eight categories, plus prompts built on corpus passages).
"""

WRITING = [
    "Write a short essay about {topic}.", "Compose a short poem about {topic}.",
    "Write a blog post introducing {topic} to beginners.", "Write a persuasive paragraph on why people should care about {topic}.",
    "Draft a professional email inviting colleagues to a talk about {topic}.",
    "Write a short story in which {persona} discovers something surprising about {topic}.",
    "Write a product description for {product}, aimed at busy parents.",
    "Compose a travel blog post about a trip to {place}, highlighting food and culture.",
    "Write a haiku sequence about {season} in {place}.", "Write a limerick about {persona}.",
    "Draft a speech for the opening of a new {building} in {place}.",
    "Write a letter to a friend recommending {product}.", "Write a motivational message for someone learning {skill}.",
    "Write a short news report about a festival celebrating {topic}.",
    "Rewrite this sentence to be more concise and formal: \"{sentence}\"",
    "Give three possible titles for an article about {topic}, and explain your favourite.",
    "Write a dialogue between two students arguing about {topic}.",
    "Write the opening paragraph of a mystery novel set in {place}.",
    "Write a review of an imaginary restaurant in {place}.",
    "Write a cover letter for a job as {persona}.",
]
ROLEPLAY = [
    "Pretend you are {persona}. Describe your typical day.", "Act as {persona} and give advice to a newcomer.",
    "You are {persona}. Explain what you care about most, and why.",
    "Imagine you are {persona}. Write a short letter to your younger self.",
    "Role-play as {persona} and answer: what is the hardest part of your job?",
    "You are {persona}. A customer asks you about {topic}. What do you say?",
    "Act as a tour guide in {place} and describe the three places every visitor should see.",
    "Pretend to be {persona} giving a toast at a friend's wedding.",
    "Imagine you are {persona} stranded on an island. How do you survive the first week?",
    "As {persona}, explain {concept} to a child.",
]
REASONING = [
    "If all {plural} are animals and some animals can swim, can we conclude that some {plural} can swim? Explain.",
    "{name1} is taller than {name2}, and {name2} is taller than {name3}. Who is the shortest? Explain your reasoning.",
    "A box contains {a} red balls and {b} blue balls. If you draw one at random, what is the probability it is red?",
    "{name1} has {a} apples and gives {b} to {name2}. {name2} then gives half of them to {name3}. How many does each have?",
    "Which is heavier, a kilogram of {material} or a kilogram of feathers? Explain.",
    "Three friends, {name1}, {name2} and {name3}, each have a different pet. Describe how to work out who owns which with two clues.",
    "What comes next in the sequence {a}, {a2}, {a3}, ...? Explain the pattern.",
    "If it takes {b} workers {a} hours to build a wall, how long would it take {c2} workers? State your assumptions.",
    "Is the following argument valid? \"Every {singular} I have met was friendly, so all {plural} are friendly.\"",
    "A clock shows {hour}:00. What angle do the hour and minute hands make?",
]
MATH = [
    "What is {a} multiplied by {b}? Show your reasoning step by step.",
    "A shop sells notebooks for ${a} each. How much do {b} notebooks cost, and how much change is left from ${c}?",
    "Solve for x: {a}x + {b} = {c}. Explain each step.",
    "A train travels {c} km in {b} hours. What is its average speed?",
    "If {b} people each shake hands with every other person once, how many handshakes are there?",
    "What is the sum of the integers from 1 to {c}? Explain the method.",
    "Find the area of a rectangle with sides {a} cm and {b} cm, and its perimeter.",
    "What is {a}% of {c}?", "Is {c} a prime number? Explain how you checked.",
    "Solve the system x + y = {c}, x - y = {b}.", "What is the derivative of x^{b} + {a}x?",
    "A circle has radius {b}. What are its circumference and area?",
    "Convert {c} minutes into hours and minutes.", "What is the greatest common divisor of {a} and {c}?",
    "Simplify the fraction {a}/{c}.", "How many ways can you arrange {small} different books on a shelf?",
]
CODING = [
    "Write a Python function that {task}.", "Write a JavaScript function that {task}.",
    "Write a C++ function that {task}. Explain its time complexity.", "Write a Python function that {task}, with tests.",
    "Write a Java method that {task}.", "Write a Rust function that {task}.", "Write a SQL query that {query}.",
    "Explain the difference between a {ds1} and a {ds2}, with a Python example.",
    "How would you find a bug in a program that {task}? Give a step-by-step approach.",
    "Write a Python class for a {thing} with methods to add, remove and list items.",
    "What does the Python keyword `{keyword}` do? Give an example.",
    "Write a shell command that {shell}.",
]
EXTRACTION = [
    "Extract every person, place and date mentioned in this text and return them as JSON.\n\n{text}",
    "List the key facts in this passage as bullet points.\n\n{text}",
    "Summarize the following text in two sentences.\n\n{text}",
    "Identify the main topic of this passage and three keywords.\n\n{text}",
    "From the following text, extract all numbers and what they refer to.\n\n{text}",
    "Classify the sentiment of this review as positive, negative or neutral: \"{review}\"",
    "Return the following information as a JSON object with keys name, city and job: {name1} is {persona_bare} who lives in {place}.",
]
STEM = [
    "Explain how {concept} works, step by step.", "What is the difference between {concept} and {concept2}?",
    "Why is {concept} important in everyday life?", "Describe a simple experiment that demonstrates {concept}.",
    "What are the main advantages and disadvantages of {concept}?", "Explain {concept} in simple terms.",
    "How has {concept} changed in the last fifty years?", "What are common misconceptions about {concept}?",
    "What would happen if {concept} stopped working tomorrow?", "Give three real-world applications of {concept}.",
]
HUMANITIES = [
    "Discuss the historical significance of {topic}.", "What are the most important things to know about {topic}?",
    "Give five interesting questions to discuss about {topic}, and explain why each matters.",
    "Compare the cultures of {place} and {place2}.", "What can we learn from the history of {topic}?",
    "Explain the main ideas of {school} in philosophy.", "How did {event} change the world?",
    "What role does {value} play in a democratic society?", "Describe the economy of {place} in a few sentences.",
    "What are the ethical questions raised by {concept}?",
    "Paraphrase this passage from Shakespeare in modern English.\n\n{verse}",
    "Who might be speaking in this passage, and what are they feeling?\n\n{verse}",
]
FACTS = [
    "Explain this statement in simple terms: \"{sentence_wiki}\"",
    "Write three questions a student might ask about this fact, and answer them: {sentence_wiki}",
    "Is the following statement likely to be true? Explain your reasoning. \"{sentence_wiki}\"",
    "Write a short story that begins with this sentence: \"{sentence_wiki}\"",
    "Turn this sentence into a multiple-choice quiz question with four options: {sentence_wiki}",
    "What background knowledge does a reader need to understand this? \"{sentence_wiki}\"",
]
DOCSTRING_CODING = [
    "Write a Python function `{signature}` that does the following: {doc}",
    "Implement `{signature}` in Python. Its documentation says: \"{doc}\" Add a short docstring and an example.",
    "What might a Python function documented as \"{doc}\" be used for? Show an example call.",
]
NEWS = [
    "Summarize this news report in three bullet points.\n\n{news}",
    "Who are the people and organisations mentioned in this report, and what did each do?\n\n{news}",
    "Write a headline and a one-sentence summary for this news report.\n\n{news}",
    "Rewrite this news report for a ten-year-old reader.\n\n{news}",
]
CONSTRAINED = [
    "Write a {n}-paragraph {genre} about {topic}. Use a {tone} tone and end with a question.",
    "Draft a {doc_type} for {audience} explaining {concept} in under {words} words.",
    "Describe {place} to someone who has never been there, using vivid sensory details.",
    "Write a dialogue between {persona} and {persona2} about {topic}.",
    "Create a lesson plan for teaching {concept} to {audience}, with three activities.",
    "Give me a step-by-step plan to {goal}.", "What are the pros and cons of {choice}? Give a recommendation.",
    "Compare {concept} and {concept2} in a table, then summarise the key difference.",
    "Summarize the plot of a short story about {persona} in {place} in five bullet points.",
    "I want to {goal}. What should I do first, and what mistakes should I avoid?",
]
CODE_REVIEW = [
    "Explain what the following Python code does.\n\n```python\n{code}\n```",
    "Review this Python code and suggest improvements.\n\n```python\n{code}\n```",
]

PERSONAS = ["a pirate captain", "a medieval knight", "a startup founder", "a detective", "a famous chef", "a doctor",
            "a primary-school teacher", "an astronaut", "a librarian", "a robot butler", "a personal fitness trainer",
            "a farmer", "a jazz musician", "a museum curator", "a software engineer", "a marine biologist",
            "a lighthouse keeper", "a travel writer", "a park ranger", "a nurse", "a firefighter", "a wizard",
            "a professional gamer", "a beekeeper", "a journalist", "an architect", "a mountain guide", "a baker"]
CONCEPTS = ["photosynthesis", "vaccines", "black holes", "the internet", "electric motors", "plate tectonics",
            "machine learning", "DNA replication", "nuclear fusion", "the greenhouse effect", "antibiotics",
            "compound interest", "public-key cryptography", "the water cycle", "GPS", "batteries", "inflation",
            "natural selection", "supply and demand", "quantum computing", "solar panels", "the immune system",
            "blockchain", "gravity", "climate change", "3D printing", "the stock market", "recycling", "sleep",
            "neural networks", "wind turbines", "the human heart", "volcanoes", "tides", "earthquakes",
            "electric cars", "social media", "renewable energy", "the placebo effect", "game theory"]
PLACES = ["Paris", "Tokyo", "Kenya", "Peru", "Iceland", "New York", "Rome", "Cairo", "Sydney", "Mexico City",
          "Norway", "India", "Brazil", "Scotland", "Vietnam", "Morocco", "Canada", "Istanbul", "Bali", "Chile"]
PRODUCTS = ["a smart water bottle", "noise-cancelling headphones", "a foldable electric bike", "a solar phone charger",
            "a robot vacuum cleaner", "a reusable notebook", "a language-learning app", "an air purifier"]
SKILLS = ["the piano", "a new language", "to code", "to swim", "public speaking", "chess", "to cook", "to draw"]
EVENTS = ["the printing press", "the Industrial Revolution", "the invention of the telephone", "the moon landing",
          "the fall of the Roman Empire", "the discovery of penicillin", "the French Revolution", "the Renaissance"]
SCHOOLS = ["Stoicism", "utilitarianism", "existentialism", "Confucianism", "empiricism", "pragmatism"]
VALUES = ["free speech", "the rule of law", "education", "a free press", "voting", "civic duty"]
NAMES = ["Alice", "Bob", "Carmen", "David", "Elena", "Farid", "Grace", "Hiro", "Ines", "James", "Kofi", "Lena"]
ANIMALS = [("cat", "cats"), ("dog", "dogs"), ("penguin", "penguins"), ("horse", "horses"), ("whale", "whales")]
SENTENCES = ["We are going to try and get the report done by the end of the week, hopefully.",
             "The meeting was kind of long and a lot of people didn't really say much.",
             "I think that maybe the new policy is not that good for most of the workers.",
             "Our team basically finished the project but there are still some small things left to do."]
REVIEWS = ["The food was cold and the waiter ignored us for twenty minutes.",
           "Absolutely loved this phone, the battery lasts two days!", "It was fine. Nothing special, nothing bad.",
           "The plot dragged in the middle but the ending made up for it."]
TASKS = ["reverses a string", "checks whether a number is prime", "returns the n-th Fibonacci number",
         "merges two sorted lists", "counts the words in a text", "finds the longest common prefix of some strings",
         "removes duplicates from a list while keeping the order", "computes the median of a list",
         "validates an email address", "converts a Roman numeral to an integer", "flattens a nested list",
         "finds the two numbers in a list that add up to a target", "parses a CSV line", "checks for balanced brackets",
         "computes the greatest common divisor", "sorts a list of dictionaries by a key", "implements binary search",
         "returns all permutations of a string", "computes a moving average", "reads a file and counts its lines",
         "checks whether a string is a palindrome", "finds the largest element in a list",
         "converts Celsius to Fahrenheit", "counts the vowels in a string", "returns the factorial of n",
         "transposes a matrix", "finds the k most frequent words in a text", "rotates a list by k positions"]
QUERIES = ["finds the ten customers with the highest total orders", "counts the employees in each department",
           "lists the products that were never ordered", "finds the average salary per city"]
DATA_STRUCTURES = ["list", "tuple", "set", "dictionary", "stack", "queue", "linked list", "binary tree", "hash map"]
KEYWORDS = ["yield", "with", "lambda", "global", "assert", "async", "nonlocal", "finally"]
SHELL = ["counts the lines in every .txt file in a folder", "finds the ten largest files in a directory",
         "lists the processes using the most memory", "renames every .jpeg file to .jpg"]
THINGS = ["shopping cart", "library catalogue", "to-do list", "playlist", "address book", "parking garage"]
MATERIALS = ["iron", "bricks", "water", "gold", "sand"]
GENRES = ["blog post", "story", "essay", "newsletter", "speech", "product review", "letter"]
TONES = ["friendly", "formal", "humorous", "enthusiastic", "neutral", "persuasive"]
DOC_TYPES = ["memo", "one-page guide", "FAQ", "short email", "social media post", "press release"]
AUDIENCES = ["new employees", "high-school students", "senior citizens", "investors", "nurses", "children",
             "first-year university students", "small business owners"]
GOALS = ["learn a new language in six months", "run a marathon", "start a vegetable garden", "save money for a house",
         "get better sleep", "prepare for a job interview", "write a novel", "organise a community event",
         "reduce my screen time", "learn to program in Python", "plan a trip to {place}", "start a podcast"]
CHOICES = ["working from home", "electric cars", "nuclear power", "homeschooling", "renting versus buying a home",
           "social media for teenagers", "a four-day work week", "learning Latin", "remote learning", "city life"]
SEASONS = ["spring", "summer", "autumn", "winter"]
CATEGORIES = {"writing": (WRITING, 3), "constrained": (CONSTRAINED, 3), "roleplay": (ROLEPLAY, 2),
              "reasoning": (REASONING, 2), "math": (MATH, 2), "coding": (CODING, 2), "docstring": (DOCSTRING_CODING, 2),
              "extraction": (EXTRACTION, 1), "news": (NEWS, 1), "facts": (FACTS, 3), "stem": (STEM, 2),
              "humanities": (HUMANITIES, 2), "code_review": (CODE_REVIEW, 1)}
